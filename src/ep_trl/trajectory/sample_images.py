"""The images an asynchronous sample carries, processed once, and the check that they match the sample's image
placeholders.

TRL's ``RolloutSample`` has ids, masks and logprobs, no images, and TRL's ``RolloutQueueDataset`` hands only some of
its fields on to the packer: ``input_ids`` unchanged (the same object), the others rebuilt. So the images of an
episode ride on its sample's ``input_ids``: an :class:`ImageIds` array is the ids (``int64``, as TRL expects) with the
episode's images, in placeholder order across prompt and completion, as its ``images`` attribute, and what the
processing class made of them as its ``processed`` attribute (:class:`ProcessedImages`: the pixel tensors the model
takes and the number of image tokens they expand into). They go wherever the ids go and are freed with them: when the
sample is trained on (the packed row is dropped after its step) or dropped (stale, oversize).
``ep_trl.trainers.async_images`` reads them off the ids it packs.

Each image is processed once: an episode processes each of its images as the turn that brings it is rendered, in a
thread (``ChatTemplate.prepare_images``), and the worker's chat template keeps the pixel tensors (``keep_pixels``),
which the episode's trajectory carries joined (``Trajectory.processed``) into its sample. An episode whose images
were not all kept so (a shard process's) has ``EvalRolloutWorker`` run :func:`process_images` over its images in a
thread of its own, off the event loop that plays the episodes, as it makes the sample. The trainer's collator joins the
carried tensors into a row's vision inputs and checks the row's image tokens against the carried counts, processing
nothing again. A sample whose ids carry images and nothing processed (a custom worker's ``ids_with_images(ids,
images)``) is processed once by the collator (:func:`processed_images_of`), in the trainer's data loading.
Processed pixels are float tensors, larger than the decoded images they come from (measured in docs/benchmarks.md):
``EvalRolloutWorker(max_buffered_images=...)`` bounds how many images the worker holds, each with its pixels (not
those of the samples the trainer took; ``EvalRolloutWorker.bounded_images`` says what it counts).

An episode whose images do not match its placeholders (a different number of image tokens than the processing class
expands its images into) would make the model's forward pass raise in the trainer; :func:`placeholder_mismatch` says so
before the sample is made, and the worker leaves such an episode out as a failed sample (counted).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from .types import Image, MultimodalProcessingClass, ProcessingClass

if TYPE_CHECKING:  # torch is imported by the processing class, not with ep_trl
    import torch


@dataclass(frozen=True)
class ProcessedImages:
    """One sample's images as the model takes them: ``pixels`` is what the image processor makes of them
    as one row of a batch (``pixel_values``, and ``pixel_attention_mask`` or ``image_grid_thw`` as the model needs),
    ``image_tokens`` how many image tokens the processing class expands them into (the count the sample's ids must
    hold)."""

    pixels: Mapping[str, torch.Tensor]
    image_tokens: int


class ImageIds(np.ndarray):
    """Token ids that carry the images they hold (``images``, in placeholder order) and what the processing class made
    of them (``processed``; None until processed). Every view or copy made by numpy carries them too; ``tolist()`` and
    ``len()`` are the plain ids'."""

    images: tuple[Image, ...]
    processed: ProcessedImages | None

    def __array_finalize__(self, obj: object) -> None:
        self.images = getattr(obj, "images", ())
        self.processed = getattr(obj, "processed", None)

    def __reduce__(self) -> tuple[object, object, object]:  # pickled (a multiprocessing queue) with its images
        reduced = super().__reduce__()
        if isinstance(reduced, str):
            raise TypeError(f"numpy reduced an array to the global name {reduced!r}; ep_trl expects a tuple")
        rebuild, arguments, state = reduced
        return rebuild, arguments, (state, self.images, self.processed)

    def __setstate__(self, state: Any) -> None:
        array_state, self.images, self.processed = state
        super().__setstate__(array_state)


def ids_with_images(
    ids: Sequence[int], images: Sequence[Image], processed: ProcessedImages | None = None
) -> np.ndarray:
    """``ids`` as an ``int64`` array; an :class:`ImageIds` holding ``images`` (and ``processed``, what
    :func:`process_images` made of them) when there are any."""
    array = np.asarray(ids, dtype=np.int64)
    if not images:
        return array
    carried = array.view(ImageIds)
    carried.images = tuple(images)
    carried.processed = processed
    return carried


def images_of(ids: object) -> tuple[Image, ...]:
    """The images a sample's ``input_ids`` carry (none for plain ids)."""
    return tuple(getattr(ids, "images", ()))


def processed_images_of(processing_class: ProcessingClass | None, ids: object) -> ProcessedImages:
    """What the processing class made of the images a sample's ``input_ids`` carry: the carried result, or, for ids that
    carry images alone (a custom worker's ``ids_with_images(ids, images)``), :func:`process_images` run on them now."""
    carried = getattr(ids, "processed", None)
    return carried if carried is not None else process_images(processing_class, images_of(ids))


def image_token_id(processing_class: ProcessingClass | None) -> int:
    """The id of the token each image's pixels stand in for (``processing_class.image_token_id``, else the tokenizer's
    id of ``processing_class.image_token``); ``ValueError`` for a processing class that names no image token (a text
    tokenizer, None)."""
    token_id = getattr(processing_class, "image_token_id", None)
    if isinstance(token_id, int):
        return token_id
    token = getattr(processing_class, "image_token", None)
    if not isinstance(token, str):
        raise ValueError(
            f"{type(processing_class).__name__} names no image token (image_token / image_token_id): the images "
            "of a sample cannot be matched to its placeholders; use the vision-language model's own "
            "processing class (AutoProcessor.from_pretrained(model))."
        )
    processor = cast("MultimodalProcessingClass", processing_class)  # it names an image token: a multimodal processor
    return int(processor.tokenizer.convert_tokens_to_ids(token))


def config_image_token(config: object) -> int | None:
    """The token id a model's config puts image features at (``image_token_id``, else ``image_token_index``), or
    None when it names none."""
    return getattr(config, "image_token_id", getattr(config, "image_token_index", None))


def process_images(processing_class: ProcessingClass | None, images: Sequence[Image]) -> ProcessedImages:
    """One run of ``processing_class`` over ``images`` (one placeholder each, with the images): the pixel tensors the
    image processor makes of them and the number of image tokens they expand into. Each image is processed here once;
    nothing downstream processes it again."""
    if not images:
        raise ValueError("process_images needs at least one image (a sample without images carries none)")
    token = getattr(processing_class, "image_token", None)
    if not isinstance(token, str):
        raise ValueError(
            f"{type(processing_class).__name__} names no image placeholder (image_token) to expand images at; "
            "use the vision-language model's own processing class (AutoProcessor.from_pretrained(model))."
        )
    processor = cast(
        "MultimodalProcessingClass", processing_class
    )  # it names an image placeholder: a multimodal processor
    made = processor(text=[token * len(images)], images=[list(images)], add_special_tokens=False, return_tensors="pt")
    return ProcessedImages(
        pixel_outputs(processor, made, len(images)),
        int((made["input_ids"][0] == image_token_id(processing_class)).sum()),
    )


def pixel_outputs(
    processor: MultimodalProcessingClass, made: Mapping[str, object], images: int
) -> dict[str, torch.Tensor]:
    """The pixel tensors of what a processor call ``made`` (``return_tensors="pt"``) of ``images`` image(s): every
    output but the text's."""
    text_keys = {*processor.tokenizer.model_input_names, "mm_token_type_ids", "token_type_ids"}
    pixels = {key: cast("torch.Tensor", value) for key, value in made.items() if key not in text_keys}
    if "pixel_values" not in pixels:
        raise ValueError(
            f"{type(processor).__name__} made no pixel_values of {images} image(s) (it returned "
            f"{sorted(made)}): it is not a vision-language model's processing class."
        )
    return pixels


def placeholder_mismatch(
    processing_class: ProcessingClass | None, ids: Sequence[int], processed: ProcessedImages | None
) -> str | None:
    """Why the images ``processed`` came from cannot be the pixels of ``ids`` (the counts of image tokens differ), or
    None when they match (``processed`` None: no images, so no image token either)."""
    token = image_token_id(processing_class)
    held = sum(1 for t in ids if int(t) == token)
    expected = processed.image_tokens if processed is not None else 0
    if held == expected:
        return None
    return f"the ids hold {held} image tokens and the processing class expands the episode's images into {expected}"
