"""A vision-language model's pixel inputs for token ids that already hold their images' expanded tokens.

The in-process generation backend (``model.generate``) and the TRL seam (the trainer's forward passes) both build
them here, so the model sees the same pixels when it samples a turn as when TRL scores it. They are built the way
TRL 1.16 builds them for images in tool responses: the image processor over each row's images, plus the
per-token modality ids (``mm_token_type_ids``) for processing classes whose models need them (Qwen-VL's M-RoPE),
computed from the ids themselves, never from re-tokenized text.

The asynchronous trainer's rows are built from images processed already
(``ep_trl.trajectory.sample_images.ProcessedImages``, one sample's images each): :func:`joined_vision_inputs` joins
their tensors the way the image processor lays out one row's images, so no image is processed a second time.

The ``processing_class`` these take is a multimodal processing class, left untyped: the trainers hold theirs as an
optional ``ProcessingClass``, checked before they call, which the checker cannot narrow here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .types import Image

if TYPE_CHECKING:  # torch is imported when inputs are built, not with ep_trl
    import torch


@dataclass(frozen=True)
class VisionInputs:
    """``model_kwargs`` go to the model next to ``input_ids`` (``pixel_values``, and ``image_grid_thw``,
    ``pixel_attention_mask`` or ``mm_token_type_ids`` as the model needs); ``num_images`` says how many entries of
    ``pixel_values`` along its first axis belong to each row, the way TRL slices them (for an image processor that pads
    images per row, as Idefics3's does, every row holds the same number of slots)."""

    model_kwargs: dict[str, torch.Tensor]
    num_images: list[int]


def vision_inputs(
    processing_class: Any, input_ids: torch.Tensor, images: Sequence[Sequence[Image]]
) -> VisionInputs | None:
    """The vision inputs for rows of ``input_ids`` (a padded tensor) whose images, in placeholder order, are
    ``images[row]``; None when no row holds an image."""
    rows = [list(row) for row in images]
    if len(rows) != input_ids.shape[0]:
        raise ValueError(f"{len(rows)} rows of images for {input_ids.shape[0]} rows of token ids")
    if not any(rows):
        return None
    kwargs = dict(processing_class.image_processor(images=rows, return_tensors="pt"))
    return _with_token_types(processing_class, input_ids, kwargs, [len(row) for row in rows])


def joined_vision_inputs(
    processing_class: Any, input_ids: torch.Tensor, pixels: Sequence[Mapping[str, torch.Tensor]], num_images: int
) -> VisionInputs:
    """The vision inputs of one row of ``input_ids`` (shape ``(1, n)``) whose ``num_images`` images were processed
    already, a part at a time, in placeholder order (``pixels``: the image processor's outputs, each for one row):
    the parts joined as the image processor lays out one row's images: along the per-row image axis for processors
    that give each row its own (Idefics2/3's), each image zero-padded to the largest height and width as those pad a
    batch; else along the first axis (Qwen-VL's patches and grids). Equal to :func:`vision_inputs` over the same
    images, without processing them again."""
    if input_ids.shape[0] != 1:
        raise ValueError(f"joined_vision_inputs builds one row, got {input_ids.shape[0]} rows of token ids")
    return _with_token_types(processing_class, input_ids, joined_pixels(pixels), [num_images])


def joined_pixels(pixels: Sequence[Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The image processor's outputs for parts of one row's images (each for one row, in placeholder order) joined
    as it lays out the row's images at once: along the per-row image axis for processors that give each row its own
    (Idefics2/3's), each image zero-padded to the largest height and width; else along the first axis (Qwen-VL's
    patches and grids)."""
    import torch

    if not pixels:
        raise ValueError("joined_pixels needs the processed pixels of at least one image")
    if not _per_row(pixels[0], 1):
        return {key: torch.cat([part[key] for part in pixels]) for key in pixels[0]}
    kwargs = {}
    for key in pixels[0]:
        parts = [part[key] for part in pixels]
        frame = [max(sizes) for sizes in zip(*(part.shape[2:] for part in parts))]
        kwargs[key] = torch.cat([_zero_padded(part, frame) for part in parts], dim=1)
    return kwargs


def _zero_padded(part: torch.Tensor, frame: list[int]) -> torch.Tensor:
    """``part`` (rows, images, ...) padded with zeros at the end of each axis after the second up to ``frame``."""
    import torch

    padding = [amount for have, want in reversed(list(zip(part.shape[2:], frame))) for amount in (0, want - have)]
    return torch.nn.functional.pad(part, padding) if any(padding) else part


def _per_row(kwargs: Mapping[str, torch.Tensor], rows: int) -> bool:
    """Whether the image processor laid its output out per row (``pixel_values`` of shape ``(rows, images, C, H, W)``,
    rows padded to the same number of images) rather than per image or patch."""
    pixel_values = kwargs["pixel_values"]
    return "image_grid_thw" not in kwargs and pixel_values.dim() == 5 and pixel_values.shape[0] == rows


def _with_token_types(
    processing_class: Any, input_ids: torch.Tensor, kwargs: dict[str, torch.Tensor], images_per_row: list[int]
) -> VisionInputs:
    """``kwargs`` with the per-token modality ids the processing class's model needs, and the entries of
    ``pixel_values`` that belong to each row."""
    import torch

    rows = len(images_per_row)
    num_images = [int(kwargs["pixel_values"].shape[1])] * rows if _per_row(kwargs, rows) else images_per_row
    if getattr(processing_class, "return_mm_token_type_ids", False):
        kwargs["mm_token_type_ids"] = torch.tensor(
            processing_class.create_mm_token_type_ids(input_ids.tolist()),
            dtype=input_ids.dtype,
            device=input_ids.device,
        )
    return VisionInputs(kwargs, num_images)
