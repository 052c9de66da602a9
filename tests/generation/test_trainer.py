"""In-process generation: batching of concurrent requests, per-row cuts, real sampled-token logprobs."""

import asyncio
from typing import TYPE_CHECKING

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from ep_trl.generation import SamplingParams
from ep_trl.generation.trainer import TrainerGenerator
from tests.support.device import device_under_test
from tests.support.references import teacher_forced_logprobs

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from ep_trl.generation import Generation


@pytest.fixture(scope="module")
def model_and_tokenizer(tiny_model_dir: "Path") -> "tuple[PreTrainedModel, PreTrainedTokenizerBase]":
    # transformers wraps PreTrainedModel.to with functools.wraps, and mypy loses the method's binding
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).to(device_under_test())  # type: ignore[arg-type]
    return model, AutoTokenizer.from_pretrained(tiny_model_dir)


def make_generator(model: "PreTrainedModel", tokenizer: "PreTrainedTokenizerBase") -> TrainerGenerator:
    return TrainerGenerator(lambda: model, tokenizer, [tokenizer.eos_token_id], tokenizer.pad_token_id)


def run_concurrently(
    generator: TrainerGenerator, prompts: "Sequence[Sequence[int]]", params_list: "Sequence[SamplingParams]"
) -> "list[Generation]":
    async def main() -> "list[Generation]":
        try:
            return await asyncio.gather(*(generator.generate(p, s) for p, s in zip(prompts, params_list)))
        finally:
            await generator.aclose()

    return asyncio.run(main())


def test_concurrent_requests_are_batched_and_cut_per_row(
    model_and_tokenizer: "tuple[PreTrainedModel, PreTrainedTokenizerBase]",
) -> None:
    model, tokenizer = model_and_tokenizer
    generator = make_generator(model, tokenizer)
    prompts = [
        tokenizer.encode("hello world"),
        tokenizer.encode("a much longer prompt than the first one"),
        tokenizer.encode("x"),
        tokenizer.encode("three"),
    ]
    params = [SamplingParams(max_tokens=n) for n in (3, 9, 5, 7)]
    results = run_concurrently(generator, prompts, params)
    assert generator.requests == 4 and generator.batches < 4  # requests that queued up ran together
    model.eval()
    for prompt, p, result in zip(prompts, params, results):
        assert 0 < len(result.token_ids) <= p.max_tokens
        assert result.finish_reason == ("stop" if result.token_ids[-1] == tokenizer.eos_token_id else "length")
        # left padding in the batch does not change the logprobs of the sampled tokens
        ref = torch.tensor(teacher_forced_logprobs(model, prompt, result.token_ids))
        assert torch.allclose(torch.tensor(result.logprobs), ref, atol=1e-4)


def test_temperature_scales_the_returned_logprobs(
    model_and_tokenizer: "tuple[PreTrainedModel, PreTrainedTokenizerBase]",
) -> None:
    model, tokenizer = model_and_tokenizer
    prompt = tokenizer.encode("temperature check")
    (result,) = run_concurrently(
        make_generator(model, tokenizer), [prompt], [SamplingParams(temperature=0.5, max_tokens=6)]
    )
    ref = torch.tensor(teacher_forced_logprobs(model, prompt, result.token_ids, temperature=0.5))
    assert torch.allclose(torch.tensor(result.logprobs), ref, atol=1e-4)


def test_stop_string_ends_the_turn_at_the_token_that_completes_it(
    model_and_tokenizer: "tuple[PreTrainedModel, PreTrainedTokenizerBase]",
) -> None:
    model, tokenizer = model_and_tokenizer
    torch.manual_seed(0)
    prompts = [tokenizer.encode("stop strings")] * 6
    results = run_concurrently(
        make_generator(model, tokenizer), prompts, [SamplingParams(max_tokens=40, stop=("e",))] * 6
    )
    stopped = [r for r in results if r.stop_text == "e"]
    assert stopped, "no sample produced an 'e' in 40 tokens"
    for r in stopped:
        text = tokenizer.decode(list(r.token_ids), skip_special_tokens=True)
        assert "e" in text and "e" not in tokenizer.decode(list(r.token_ids[:-1]), skip_special_tokens=True)
        assert r.finish_reason == "stop"


def test_negative_temperature_is_refused_and_zero_decodes_greedily(
    model_and_tokenizer: "tuple[PreTrainedModel, PreTrainedTokenizerBase]",
) -> None:
    """Temperature 0 is greedy decoding (held-out episodes, ``ep-trl train --held-out``): each token is the most likely
    one after the tokens before it, whatever the random state."""
    model, tokenizer = model_and_tokenizer
    with pytest.raises(ValueError, match="temperature"):
        run_concurrently(make_generator(model, tokenizer), [[1, 2]], [SamplingParams(temperature=-1.0)])
    prompt = tokenizer.encode("greedy please")
    results = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        results += run_concurrently(
            make_generator(model, tokenizer), [prompt], [SamplingParams(temperature=0.0, max_tokens=6)]
        )
    assert results[0].token_ids == results[1].token_ids
    ids = list(prompt)
    with torch.no_grad():
        for token in results[0].token_ids:
            assert token == int(model(torch.tensor([ids])).logits[0, -1].argmax())
            ids.append(token)


def test_it_implements_the_whole_generator_protocol(
    model_and_tokenizer: "tuple[PreTrainedModel, PreTrainedTokenizerBase]",
) -> None:
    """The rollout never asks which backend it holds: name, context limit and failure state come from here."""
    model, tokenizer = model_and_tokenizer
    generator = make_generator(model, tokenizer)
    assert generator.name == "trainer"
    assert generator.max_model_len == model.config.max_position_embeddings
    assert generator.failure is None  # its errors are per request: handed to the episodes that asked
    asyncio.run(generator.begin_call())
    assert generator.failure is None


def test_a_turn_for_a_named_model_is_refused_naming_the_fix(
    model_and_tokenizer: "tuple[PreTrainedModel, PreTrainedTokenizerBase]",
) -> None:
    """``generate_as`` is part of the ``Generator`` protocol; the in-process backend serves the trainer's model only,
    so a turn for a LoRA adapter by name is refused with what to do, not an AttributeError (issue 41)."""
    from ep_trl import ConfigError
    from ep_trl.generation.versioned import VersionedTurns

    turns = VersionedTurns(make_generator(*model_and_tokenizer), lambda: 3, model_for=lambda version: f"v{version}")
    with pytest.raises(
        ConfigError,
        match=r"trainer backend generates with its one model only, not with 'v3'.*"
        r"vLLM server that serves the adapters",
    ):
        asyncio.run(turns.generate([1, 2], SamplingParams(max_tokens=1)))
    assert turns.versions == [3]
