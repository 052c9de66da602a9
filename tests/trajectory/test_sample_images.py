"""What the processor makes of a sample's images (``ep_trl.trajectory.sample_images.process_images``: the image token
count and the pixels, from one run), the placeholder check on it, and processed images travelling with their ids."""

import pickle
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from transformers import AutoProcessor

from ep_trl.trajectory.sample_images import ImageIds, ids_with_images, placeholder_mismatch, process_images

if TYPE_CHECKING:
    from pathlib import Path


def test_the_image_token_count_is_the_processors_expansion(tiny_vlm_dir: "Path", images: list[Any]) -> None:
    processor = AutoProcessor.from_pretrained(tiny_vlm_dir)
    processed = process_images(processor, images[:2])
    expanded = processor(text=[processor.image_token * 2], images=[images[:2]], add_special_tokens=False)["input_ids"]
    assert processed.image_tokens == expanded[0].count(processor.image_token_id) == 32  # 16 per image, tiny VLM
    held = [processor.image_token_id] * 32 + [5]
    assert placeholder_mismatch(processor, held, processed) is None
    too_few = placeholder_mismatch(processor, held[16:], processed)
    assert too_few is not None and "hold 16 image tokens" in too_few
    none_expanded = placeholder_mismatch(processor, held, None)
    assert none_expanded is not None
    assert "hold 32 image tokens and the processing class expands the episode's images into 0" in none_expanded


def test_processed_images_travel_with_the_ids(tiny_vlm_dir: "Path", images: list[Any]) -> None:
    """Views, copies and pickles (a multiprocessing queue) of the ids carry the images and what was made of them."""
    processor = AutoProcessor.from_pretrained(tiny_vlm_dir)
    processed = process_images(processor, images[:1])
    ids = ids_with_images([1, 2, 3], images[:1], processed)
    for carried in (ids[1:], ids.copy(), pickle.loads(pickle.dumps(ids))):
        assert isinstance(carried, ImageIds) and carried.processed is not None
        assert len(carried.images) == 1 and carried.processed.image_tokens == processed.image_tokens == 16
        assert torch.equal(carried.processed.pixels["pixel_values"], processed.pixels["pixel_values"])
    assert type(ids_with_images([1, 2], ())) is np.ndarray  # no images: plain ids
