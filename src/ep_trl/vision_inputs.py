"""A vision-language model's pixel inputs for token ids that already hold their images' expanded tokens.

The in-process generation backend (``model.generate``) and the TRL seam (the trainer's forward passes) both build
them here, so the model sees the same pixels when it samples a turn as when TRL scores it. They are built the way
TRL 1.16 builds them for images in tool responses: the processor's image processor over each row's images, plus the
per-token modality ids (``mm_token_type_ids``) for processors whose models need them (Qwen-VL's M-RoPE), computed
from the ids themselves, never from re-tokenized text.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class VisionInputs:
    """``model_kwargs`` go to the model next to ``input_ids`` (``pixel_values``, and ``image_grid_thw``,
    ``pixel_attention_mask`` or ``mm_token_type_ids`` as the model needs); ``num_images`` says how many entries of
    ``pixel_values`` along its first axis belong to each row, the way TRL slices them (for a processor that pads
    images per row, as Idefics3's does, every row holds the same number of slots)."""

    model_kwargs: dict[str, Any]
    num_images: list[int]


def vision_inputs(processor: Any, input_ids: Any, images: Sequence[Sequence[Any]]) -> VisionInputs | None:
    """The vision inputs for rows of ``input_ids`` (a padded tensor) whose images, in placeholder order, are
    ``images[row]``; None when no row holds an image."""
    import torch

    rows = [list(row) for row in images]
    if len(rows) != input_ids.shape[0]:
        raise ValueError(f"{len(rows)} rows of images for {input_ids.shape[0]} rows of token ids")
    if not any(rows):
        return None
    kwargs = dict(processor.image_processor(images=rows, return_tensors="pt"))
    pixel_values = kwargs["pixel_values"]
    per_row = "image_grid_thw" not in kwargs and pixel_values.dim() == 5 and pixel_values.shape[0] == len(rows)
    num_images = [int(pixel_values.shape[1])] * len(rows) if per_row else [len(row) for row in rows]
    if getattr(processor, "return_mm_token_type_ids", False):
        kwargs["mm_token_type_ids"] = torch.tensor(processor.create_mm_token_type_ids(input_ids.tolist()),
                                                   dtype=input_ids.dtype, device=input_ids.device)
    return VisionInputs(kwargs, num_images)
