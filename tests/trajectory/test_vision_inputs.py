"""A row's vision inputs joined from images processed a sample at a time equal those of the row's images processed
together (``ep_trl.trajectory.vision_inputs.joined_vision_inputs`` over
``ep_trl.trajectory.sample_images.process_images``), for Idefics3's layout (the tiny VLM's processor: frames of one
size) and Idefics2's (frames of each image's own size, zero-padded per row)."""

from typing import TYPE_CHECKING, Any

import pytest
import torch
from transformers import AutoProcessor, Idefics2Processor
from transformers.models.idefics2.image_processing_pil_idefics2 import Idefics2ImageProcessorPil

from ep_trl.trajectory.sample_images import process_images
from ep_trl.trajectory.vision_inputs import joined_vision_inputs, vision_inputs

if TYPE_CHECKING:
    from pathlib import Path


def idefics2_processor(tiny_vlm_dir: "Path") -> Idefics2Processor:
    """Idefics2's processor over the tiny VLM's tokenizer: each image resized to its own aspect (no square frame)."""
    image_processor = Idefics2ImageProcessorPil(
        do_image_splitting=False, size={"shortest_edge": 32, "longest_edge": 64}
    )
    return Idefics2Processor(
        image_processor=image_processor,
        image_seq_len=4,
        tokenizer=AutoProcessor.from_pretrained(tiny_vlm_dir).tokenizer,
    )


@pytest.mark.parametrize("layout", ["idefics3", "idefics2"])
def test_joined_inputs_equal_the_rows_images_processed_together(
    tiny_vlm_dir: "Path", layout: str, images: list[Any]
) -> None:
    processor = (
        AutoProcessor.from_pretrained(tiny_vlm_dir) if layout == "idefics3" else idefics2_processor(tiny_vlm_dir)
    )
    parts = [process_images(processor, images[:2]), process_images(processor, images[2:])]  # two samples of a row
    ids = torch.zeros(1, 8, dtype=torch.long)
    joined = joined_vision_inputs(processor, ids, [part.pixels for part in parts], num_images=3)
    together = vision_inputs(processor, ids, [images])
    assert joined is not None and together is not None
    assert joined.num_images == together.num_images == [3]
    assert joined.model_kwargs.keys() == together.model_kwargs.keys() >= {"pixel_values", "pixel_attention_mask"}
    for key, value in together.model_kwargs.items():
        assert torch.equal(joined.model_kwargs[key], value), key
    if layout == "idefics2":  # the frames differ in size: the smaller ones were padded
        assert {tuple(part.pixels["pixel_values"].shape[-2:]) for part in parts} != {(64, 64)}
