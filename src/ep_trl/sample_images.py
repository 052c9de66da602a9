"""The images an asynchronous sample carries, and the check that they match the sample's image placeholders.

TRL's ``RolloutSample`` has ids, masks and logprobs, no images, and TRL's ``RolloutQueueDataset`` hands only some of
its fields on to the packer: ``input_ids`` unchanged (the same object), the others rebuilt. So the images of an
episode ride on its sample's ``input_ids``: an :class:`ImageIds` array is the ids (``int64``, as TRL expects) with the
episode's images, in placeholder order across prompt and completion, as its ``images`` attribute. They go wherever the
ids go and are freed with them: when the sample is trained on (the packed row is dropped after its step) or dropped
(stale, oversize). ``ep_trl.trainers.async_images`` reads them off the ids it packs.

An episode whose images do not match its placeholders (a different number of image tokens than the processor expands
its images into) would make the model's forward pass raise in the trainer; :func:`placeholder_mismatch` says so before
the sample is made, and the worker leaves such an episode out as a failed sample (counted).
"""

from collections.abc import Sequence
from typing import Any

import numpy as np


class ImageIds(np.ndarray):
    """Token ids that carry the images they hold (``images``, in placeholder order). Any view or copy made by numpy
    carries them too; ``tolist()`` and ``len()`` are the plain ids'."""

    images: tuple[Any, ...]

    def __array_finalize__(self, obj: Any) -> None:
        self.images = getattr(obj, "images", ())

    def __reduce__(self) -> Any:  # pickled (a multiprocessing queue) with its images
        rebuild, arguments, state = super().__reduce__()
        return rebuild, arguments, (state, self.images)

    def __setstate__(self, state: Any) -> None:
        array_state, self.images = state
        super().__setstate__(array_state)


def ids_with_images(ids: Sequence[int], images: Sequence[Any]) -> np.ndarray:
    """``ids`` as an ``int64`` array; an :class:`ImageIds` holding ``images`` when there are any."""
    array = np.asarray(ids, dtype=np.int64)
    if not images:
        return array
    carried = array.view(ImageIds)
    carried.images = tuple(images)
    return carried


def images_of(ids: Any) -> tuple[Any, ...]:
    """The images a sample's ``input_ids`` carry (none for plain ids)."""
    return tuple(getattr(ids, "images", ()))


def image_token_id(processor: Any) -> int:
    """The id of the token each image's pixels stand in for (``processor.image_token_id``, else the tokenizer's id of
    ``processor.image_token``)."""
    token_id = getattr(processor, "image_token_id", None)
    if isinstance(token_id, int):
        return token_id
    token = getattr(processor, "image_token", None)
    if not isinstance(token, str):
        raise ValueError(f"{type(processor).__name__} names no image token (image_token / image_token_id): the images "
                         "of a sample cannot be matched to its placeholders; use the vision-language model's own "
                         "processor (AutoProcessor.from_pretrained(model)).")
    return int(processor.tokenizer.convert_tokens_to_ids(token))


def config_image_token(config: Any) -> int | None:
    """The token id a model's config puts image features at (``image_token_id``, else ``image_token_index``), or
    None when it names none."""
    return getattr(config, "image_token_id", getattr(config, "image_token_index", None))


def expected_image_tokens(processor: Any, images: Sequence[Any]) -> int:
    """How many image tokens the processor expands ``images`` into (one placeholder each)."""
    if not images:
        return 0
    expanded = processor(text=[processor.image_token * len(images)], images=[list(images)],
                         add_special_tokens=False)["input_ids"][0]
    token = image_token_id(processor)
    return sum(1 for t in expanded if int(t) == token)


def placeholder_mismatch(processor: Any, ids: Sequence[int], images: Sequence[Any]) -> str | None:
    """Why ``images`` cannot be the pixels of ``ids`` (the counts of image tokens differ), or None when they match."""
    token = image_token_id(processor)
    held = sum(1 for t in ids if int(t) == token)
    expected = expected_image_tokens(processor, images)
    if held == expected:
        return None
    return (f"the ids hold {held} image tokens and the processor expands the episode's {len(images)} images into "
            f"{expected}")
