"""In-process generation of turns with images: sampled with the pixels, batched with other turns."""

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from transformers import AutoModelForImageTextToText, AutoProcessor

from ep_trl.generation import PromptImages, SamplingParams
from ep_trl.generation.trainer import TrainerGenerator
from ep_trl.trajectory.template import ChatTemplate
from tests.support.device import device_under_test
from tests.support.images import png_data_uri, token_logprobs, user_with_image

if TYPE_CHECKING:
    from transformers import PreTrainedModel, ProcessorMixin

    from ep_trl.generation import Generation


@pytest.fixture(scope="module")
def vlm(tiny_vlm_dir: Path) -> "tuple[PreTrainedModel, ProcessorMixin]":
    model = AutoModelForImageTextToText.from_pretrained(tiny_vlm_dir).eval().to(device_under_test())
    return model, AutoProcessor.from_pretrained(tiny_vlm_dir)


def test_turns_with_images_are_sampled_with_their_pixels(vlm: "tuple[PreTrainedModel, ProcessorMixin]") -> None:
    model, processor = vlm
    template = ChatTemplate(processor)
    tok = processor.tokenizer
    prompts = [
        template.prompt([user_with_image("Step 1", png_data_uri((255, 0, 0)))]),
        template.prompt(
            [
                user_with_image("Step 1, a longer observation", png_data_uri((0, 90, 0), (80, 20))),
                user_with_image("and another", png_data_uri((0, 0, 255))),
            ]
        ),
        template.prompt([{"role": "user", "content": "no image here"}]),
    ]
    generator = TrainerGenerator(lambda: model, tok, [tok.eos_token_id], tok.pad_token_id, processing_class=processor)

    async def main() -> "list[Generation]":
        try:
            return await asyncio.gather(
                *(
                    generator.generate(
                        p.ids,
                        SamplingParams(max_tokens=6),
                        images=PromptImages(p.images, p.unexpanded_ids) if p.images else None,
                    )
                    for p in prompts
                )
            )
        finally:
            await generator.aclose()

    results = asyncio.run(main())
    assert generator.batches == 1  # the three turns, with 1, 2 and 0 images, went through one generate call
    for prompt, result in zip(prompts, results):
        ids, n = list(prompt.ids) + list(result.token_ids), len(prompt.ids)
        with_pixels = token_logprobs(model, processor, ids, list(prompt.images))[n - 1 :]
        assert max(abs(a - b) for a, b in zip(with_pixels, result.logprobs)) < 1e-3
        if prompt.images:  # the pixels mattered: scored without them, the same tokens get other logprobs
            without = token_logprobs(model, processor, ids, list(prompt.images), pixels=False)[n - 1 :]
            assert max(abs(a - b) for a, b in zip(without, result.logprobs)) > 0.1


def test_a_turn_with_images_needs_a_multimodal_processor(vlm: "tuple[PreTrainedModel, ProcessorMixin]") -> None:
    model, processor = vlm
    tok = processor.tokenizer
    generator = TrainerGenerator(lambda: model, tok, [tok.eos_token_id], tok.pad_token_id)
    with pytest.raises(ValueError, match="text-only processing class"):
        asyncio.run(generator.generate([1, 2], SamplingParams(), images=PromptImages(("x",), (1, 2))))  # type: ignore[arg-type]  # refused before the image is read
    asyncio.run(generator.aclose())
