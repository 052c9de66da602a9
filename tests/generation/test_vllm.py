"""The vLLM server client under injected faults (FaultyVLLMServer) and its request shape.

Every case of "failures" in the vLLM-server issue: unreachable at construction, a server that accepts but never
answers, a request that times out, transient 5xx / dropped connections (retried with backoff), 4xx (not
retried), a server dying mid-training (the rollout call raises, in bounded time). Each test carries a
pytest-timeout well above what the client's own timeouts allow, so a hang fails the test instead of CI.
Behaviour against a real vLLM server is in tests/generation/test_vllm_real.py.
"""

import asyncio
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pytest
from transformers import AutoTokenizer

from ep_trl import EvalOverrides, GenerationError, VLLMOptions, create_openenv_vllm_rollout_func
from ep_trl.generation import SamplingParams
from ep_trl.generation.vllm import VLLMServerGenerator
from ep_trl.generation.vllm_wire import completion_payload, request_seed
from ep_trl.runtime.processes import free_port
from tests.support.faulty_vllm import FaultyVLLMServer
from tests.support.trainers import PROMPT, make_trainer

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine, Iterable, Iterator

    import aiohttp
    from trl import GRPOTrainer

    from ep_trl.adapters.rollout_func import RolloutFunction
    from ep_trl.adapters.sharded import ShardedRolloutFunction
    from ep_trl.generation import Generation
    from ep_trl.trajectory.tokens import TrajectoryBuilder


EVAL = "tests.evals.eval_letters::test_letters_pointwise"
T = TypeVar("T")
FAST = VLLMOptions(request_timeout_s=1.0, max_retries=2, retry_backoff_s=0.05, connect_timeout_s=2.0)


def run(coro: "Coroutine[Any, Any, T]") -> T:
    return asyncio.run(coro)


async def generate_once(
    generator: VLLMServerGenerator, prompt: "Iterable[int]" = (1, 2, 3), **params: Any
) -> "Generation":
    try:
        return await generator.generate(list(prompt), SamplingParams(**{"max_tokens": 4, **params}))
    finally:
        await generator.aclose()


@pytest.fixture(scope="module")
def canned_ids(tiny_model_dir: Path) -> tuple[int, ...]:
    """Token ids of a short action ("aei") followed by the end-of-turn token, so episodes see a sane reply."""
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    return tuple(tok.encode("aei", add_special_tokens=False)) + (tok.convert_tokens_to_ids("<|im_end|>"),)


@pytest.mark.timeout(30)
def test_unreachable_server_fails_at_construction_naming_url_and_command() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    started = time.monotonic()
    with pytest.raises(GenerationError) as err:
        VLLMServerGenerator(url, VLLMOptions())
    assert time.monotonic() - started < 10
    assert f"{url}/v1/models" in str(err.value)
    assert "trl vllm-serve --model" in str(err.value)


@pytest.mark.timeout(30)
def test_rollout_func_with_unreachable_url_fails_when_created(letters_server: str) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(GenerationError, match="trl vllm-serve --model"):
        create_openenv_vllm_rollout_func(EVAL, vllm_base_url=url, log_rollouts=False)


@pytest.mark.timeout(30)
def test_server_that_accepts_but_never_answers_fails_within_the_connect_timeout() -> None:
    with FaultyVLLMServer(hang_models=True) as server:
        started = time.monotonic()
        with pytest.raises(GenerationError, match="No vLLM server answered"):
            VLLMServerGenerator(server.url, VLLMOptions(connect_timeout_s=2.0))
        assert time.monotonic() - started < 10


@pytest.mark.timeout(30)
def test_hung_request_is_retried_then_fails_naming_the_request() -> None:
    with FaultyVLLMServer(default="hang") as server:
        generator = VLLMServerGenerator(server.url, FAST)
        with pytest.raises(GenerationError) as err:
            run(generate_once(generator, prompt=range(7)))
        assert len(server.requests) == 3  # first try + max_retries
    message = str(err.value)
    assert f"turn request #1 to {server.url}/v1/completions (prompt of 7 tokens, max_tokens=4)" in message
    assert "failed 3 times" in message and "no answer within 1 s" in message
    assert generator.failure is err.value and generator.name == "vllm"
    run(generator.begin_call())  # what the rollout does at the start of its next call: the server may be back
    assert generator.failure is None


@pytest.mark.timeout(30)
def test_transient_failures_are_retried_with_backoff() -> None:
    plan: list[str | tuple[str, int]] = [("status", 503), "drop", ("status", 429), "ok"]
    with FaultyVLLMServer(plan=plan, ok_token_ids=(11, 12)) as server:
        generator = VLLMServerGenerator(server.url, replace(FAST, max_retries=3))
        result = run(generate_once(generator))
        arrivals = [r.received_at for r in server.requests]
    assert result.token_ids == (11, 12) and result.logprobs == (-0.5, -0.5)
    assert generator.retries == 3 and len(arrivals) == 4
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
    # backoff doubles between attempts: each gap is at least its planned delay (jitter and a loaded machine only add to
    # it), so lower bounds hold however busy the machine is; comparing two gaps failed under load (issue 48)
    assert all(gap >= FAST.retry_backoff_s * 2**k for k, gap in enumerate(gaps)), gaps


def test_client_errors_fail_at_once_with_the_servers_message() -> None:
    message = "This model's maximum context length is 512 tokens. However, your prompt contains 600 input tokens"
    with FaultyVLLMServer(default=("status", 400, message)) as server:
        generator = VLLMServerGenerator(server.url, FAST)
        with pytest.raises(GenerationError) as err:
            run(generate_once(generator, prompt=range(600)))
        assert len(server.requests) == 1  # no retry loop
    assert "HTTP 400" in str(err.value) and "maximum context length is 512" in str(err.value)
    assert "prompt of 600 tokens" in str(err.value)


@pytest.mark.timeout(30)
def test_after_a_fatal_failure_later_requests_fail_without_being_sent() -> None:
    with FaultyVLLMServer(default=("status", 503)) as server:
        generator = VLLMServerGenerator(server.url, replace(FAST, max_retries=1))

        async def two_turns() -> None:
            with pytest.raises(GenerationError, match="failed 2 times"):
                await generator.generate([1, 2], SamplingParams(max_tokens=2))
            with pytest.raises(GenerationError, match="already failed for good"):
                await generator.generate([1, 2], SamplingParams(max_tokens=2))
            await generator.aclose()

        run(two_turns())
        assert len(server.requests) == 2


def test_payload_maps_every_sampling_parameter() -> None:
    params = SamplingParams(
        temperature=0.7,
        top_p=0.9,
        top_k=5,
        min_p=0.05,
        repetition_penalty=1.1,
        max_tokens=9,
        stop=("\n\n",),
        stop_token_ids=(42,),
    )
    body = completion_payload("m", (1, 2, 3), params, seed=17)
    assert body == {
        "model": "m",
        "prompt": [1, 2, 3],
        "max_tokens": 9,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 5,
        "min_p": 0.05,
        "repetition_penalty": 1.1,
        "logprobs": 0,
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
        "skip_special_tokens": False,
        "stop": ["\n\n"],
        "stop_token_ids": [42],
        "seed": 17,
    }
    off = completion_payload("m", (1,), SamplingParams(top_k=0))
    assert off["top_k"] == -1 and "seed" not in off and "stop" not in off and "stop_token_ids" not in off


def test_one_base_seed_gives_every_request_its_own_seed() -> None:
    """vLLM seeds a whole request: a GRPO group's identical first prompts with one seed would sample the same."""
    seeds = [request_seed(3, n) for n in range(1, 65)]
    assert len(set(seeds)) == 64 and all(s is not None and 0 <= s < 2**63 for s in seeds)
    assert request_seed(None, 5) is None
    with FaultyVLLMServer() as server:
        generator = VLLMServerGenerator(server.url, replace(FAST, seed=3, batch_window_s=0.05))

        async def same_prompt_twice() -> None:
            await asyncio.gather(*(generator.generate([1, 2, 3], SamplingParams(max_tokens=2)) for _ in range(2)))
            await generator.aclose()

        run(same_prompt_twice())
        sent = [r.body["seed"] for r in server.requests]
    assert len(set(sent)) == 2 and len(server.requests) == 2  # seeded turns are never batched together


@pytest.fixture
def trainer_for(tiny_model_dir: Path, tmp_path: Path) -> "Iterator[Callable[..., GRPOTrainer]]":
    built: "list[RolloutFunction | ShardedRolloutFunction]" = []

    def build(rollout: "RolloutFunction | ShardedRolloutFunction", **config: Any) -> "GRPOTrainer":
        trainer = make_trainer(tiny_model_dir, tmp_path, rollout, **config)
        built.append(rollout)
        return trainer

    yield build
    for rollout in built:
        rollout.close()


@pytest.mark.timeout(120)
def test_rollout_sends_token_ids_with_the_trainers_sampling(
    letters_server: str, trainer_for: "Callable[..., GRPOTrainer]", canned_ids: tuple[int, ...]
) -> None:
    with FaultyVLLMServer(ok_token_ids=canned_ids) as server:
        rollout = create_openenv_vllm_rollout_func(EVAL, vllm_base_url=server.url, log_rollouts=False)
        trainer = trainer_for(rollout, temperature=0.7, top_p=0.9, top_k=5, min_p=0.05, repetition_penalty=1.1)
        out = rollout([PROMPT] * 4, trainer)
        prompts = server.prompts
    assert out["episode_status"] == ["finished"] * 4 and out["num_turns"] == [3] * 4
    assert len(prompts) == 12  # 4 episodes x 3 turns
    for prompt, body in prompts:
        assert (body["temperature"], body["top_p"], body["top_k"], body["min_p"], body["repetition_penalty"]) == (
            0.7,
            0.9,
            5,
            0.05,
            1.1,
        )
        assert body["model"] == "faulty-model" and body["logprobs"] == 0 and body["return_token_ids"] is True
        assert body["max_tokens"] == 12  # the eval's per-turn max_tokens
        assert "seed" not in body  # never one shared seed for a group's identical prompts
    # each turn's prompt is exactly the episode's tokens so far: the sampled ids went back in unchanged
    sent = sorted(p for p, _ in prompts)
    expected = []
    for p, c, mask in zip(out["prompt_ids"], out["completion_ids"], out["env_mask"]):
        ends = [i for i in range(len(mask)) if mask[i] == 0 and (i == 0 or mask[i - 1] == 1)]
        starts = [i for i in range(1, len(mask)) if mask[i] == 1 and mask[i - 1] == 0]
        assert len(ends) == len(starts) == 2
        expected += [p, p + c[: starts[0]], p + c[: starts[1]]]
    assert sent == sorted(expected)
    for completion, mask, lps in zip(out["completion_ids"], out["env_mask"], out["logprobs"]):
        sampled = [t for t, m in zip(completion, mask) if m]
        assert sampled == list(canned_ids) * 3
        assert [lp for lp, m in zip(lps, mask) if m] == [-0.5] * len(sampled)


@pytest.mark.timeout(120)
def test_turns_are_clipped_to_the_servers_max_model_len(
    letters_server: str, trainer_for: "Callable[..., GRPOTrainer]", canned_ids: tuple[int, ...]
) -> None:
    with FaultyVLLMServer(ok_token_ids=canned_ids * 10, max_model_len=None) as probe:
        rollout = create_openenv_vllm_rollout_func(EVAL, vllm_base_url=probe.url, log_rollouts=False)
        trainer = trainer_for(rollout)
        prompt_len = len(rollout([PROMPT], trainer)["prompt_ids"][0])
    limit = prompt_len + 20
    with FaultyVLLMServer(ok_token_ids=canned_ids * 10, max_model_len=limit) as server:
        rollout = create_openenv_vllm_rollout_func(
            EVAL,
            vllm_base_url=server.url,
            log_rollouts=False,
            overrides=EvalOverrides(max_tokens=64),
            max_episode_tokens=1000,
        )
        out = rollout([PROMPT] * 4, trainer_for(rollout))
        prompts = server.prompts
    assert prompts and all(len(p) + body["max_tokens"] <= limit for p, body in prompts)
    assert prompts[0][1]["max_tokens"] == 20  # 64 asked, clipped to what fits
    for p, c, status in zip(out["prompt_ids"], out["completion_ids"], out["episode_status"]):
        assert status == "finished" and len(p) + len(c) <= limit


@pytest.mark.timeout(120)
def test_concurrent_episodes_overlap_within_the_request_budget(
    letters_server: str, trainer_for: "Callable[..., GRPOTrainer]", canned_ids: tuple[int, ...]
) -> None:
    with FaultyVLLMServer(ok_token_ids=canned_ids, ok_delay_s=0.3) as server:
        rollout = create_openenv_vllm_rollout_func(
            EVAL, vllm_base_url=server.url, log_rollouts=False, max_concurrent_rollouts=8
        )
        out = rollout([PROMPT] * 8, trainer_for(rollout, num_generations=8, batch_size=8))
        overlapped = server.max_concurrent_prompts
    assert out["episode_status"] == ["finished"] * 8
    assert overlapped >= 4  # one episode at a time would never exceed 1
    with FaultyVLLMServer(ok_token_ids=canned_ids, ok_delay_s=0.3) as server:
        rollout = create_openenv_vllm_rollout_func(
            EVAL,
            vllm_base_url=server.url,
            log_rollouts=False,
            max_concurrent_rollouts=8,
            vllm=VLLMOptions(max_in_flight=2),
        )
        out = rollout([PROMPT] * 8, trainer_for(rollout, num_generations=8, batch_size=8))
        assert server.max_concurrent_prompts == 2
    assert out["episode_status"] == ["finished"] * 8


@pytest.mark.timeout(60)
def test_by_default_every_turn_in_flight_reaches_the_server() -> None:
    """No cap of the client's own unless ``max_in_flight`` is set: 100 episodes in flight (past the 64 the default
    once was) have their 100 turns at the server at once, as a GPU server batches them (docs/benchmarks.md, the
    bridge at a GPU's concurrency)."""

    async def turns(generator: VLLMServerGenerator, n: int) -> "list[Generation]":
        try:
            return await asyncio.gather(
                *(generator.generate([1, 2, i], SamplingParams(max_tokens=3)) for i in range(n))
            )
        finally:
            await generator.aclose()

    assert VLLMOptions().max_in_flight is None
    with FaultyVLLMServer(ok_token_ids=(7, 8, 9), ok_delay_s=0.2) as server:
        results = run(turns(VLLMServerGenerator(server.url, FAST), 100))
        assert server.max_concurrent_prompts == 100
    assert all(r.token_ids == (7, 8, 9) for r in results)
    with FaultyVLLMServer(ok_token_ids=(7, 8, 9), ok_delay_s=0.2) as server:
        run(turns(VLLMServerGenerator(server.url, replace(FAST, max_in_flight=10)), 30))
        assert server.max_concurrent_prompts == 10


@pytest.mark.timeout(60)
def test_turns_arriving_together_share_one_request_unless_batching_is_off() -> None:
    async def eight_turns(generator: VLLMServerGenerator) -> "list[Generation]":
        try:
            return await asyncio.gather(
                *(generator.generate([1, 2, i], SamplingParams(max_tokens=3)) for i in range(8))
            )
        finally:
            await generator.aclose()

    with FaultyVLLMServer(ok_token_ids=(7, 8, 9)) as server:
        results = run(eight_turns(VLLMServerGenerator(server.url, replace(FAST, batch_window_s=0.05))))
        assert len(server.requests) == 1 and len(server.requests[0].prompts) == 8
        assert all(r.token_ids == (7, 8, 9) for r in results)
    with FaultyVLLMServer(ok_token_ids=(7, 8, 9)) as server:
        run(eight_turns(VLLMServerGenerator(server.url, replace(FAST, batch_window_s=0))))
        assert len(server.requests) == 8 and all(len(r.prompts) == 1 for r in server.requests)


@pytest.mark.timeout(60)
def test_a_rejected_batch_fails_only_the_offending_turn() -> None:
    async def turns(generator: VLLMServerGenerator) -> "list[Generation | BaseException]":
        try:
            return await asyncio.gather(
                *(generator.generate(list(range(n)), SamplingParams(max_tokens=3)) for n in (5, 50, 6)),
                return_exceptions=True,
            )
        finally:
            await generator.aclose()

    with FaultyVLLMServer(ok_token_ids=(7,), reject_longer_than=10) as server:
        short1, long, short2 = run(turns(VLLMServerGenerator(server.url, replace(FAST, batch_window_s=0.05))))
        sizes = [len(r.prompts) for r in server.requests]
    assert sizes == [3, 1, 1, 1]  # the batch, then each prompt alone; no retry loop
    assert not isinstance(short1, BaseException) and not isinstance(short2, BaseException)
    assert short1.token_ids == short2.token_ids == (7,)
    assert isinstance(long, GenerationError) and "prompt of 50 tokens" in str(long) and "HTTP 400" in str(long)


@pytest.mark.timeout(120)
def test_server_dying_mid_training_raises_from_the_rollout_call(
    letters_server: str, trainer_for: "Callable[..., GRPOTrainer]", canned_ids: tuple[int, ...]
) -> None:
    # the first request succeeds (it carries one or more episodes' first turns), then the server hangs for good
    with FaultyVLLMServer(plan=["ok"], default="hang", ok_token_ids=canned_ids) as server:
        rollout = create_openenv_vllm_rollout_func(
            EVAL,
            vllm_base_url=server.url,
            log_rollouts=False,
            vllm=VLLMOptions(request_timeout_s=1.0, max_retries=2, retry_backoff_s=0.05),
        )
        trainer = trainer_for(rollout)
        started = time.monotonic()
        with pytest.raises(GenerationError) as err:
            rollout([PROMPT] * 4, trainer)
        elapsed = time.monotonic() - started
        sent = len(server.requests)
        assert "turn request #" in str(err.value) and "failed 3 times" in str(err.value)
        assert elapsed < 30
        # the episodes that were still running gave up without a retry loop of their own
        assert sent <= 1 + 4 * 3
        # the server is back: the next call works again
        server.set_plan([], default="ok")
        out = rollout([PROMPT] * 4, trainer)
    assert out["episode_status"] == ["finished"] * 4


def test_request_bodies_are_the_payload_with_the_prompts_json_spliced_in() -> None:
    """What goes out (``body_with_prompt``) decodes to ``completion_payload``'s body, for any sampling settings and
    prompts given as ``PromptIds`` (their kept JSON), lists, tuples or numpy ids."""
    import json
    import random

    import numpy as np

    from ep_trl.generation import PromptIds
    from ep_trl.generation.vllm_wire import body_with_prompt, completion_fields, fields_json, prompt_json

    rng = random.Random(3)
    for case in range(200):
        params = SamplingParams(
            temperature=rng.choice([0.0, 0.7, 1.0, 1.3]),
            top_p=rng.random(),
            top_k=rng.randrange(-1, 50),
            max_tokens=rng.randrange(1, 4096),
            stop=tuple(rng.choice(["\n", '"}', "é"]) for _ in range(rng.randrange(3))),
            stop_token_ids=tuple(rng.randrange(10) for _ in range(rng.randrange(3))),
        )
        ids = [rng.randrange(300_000) for _ in range(rng.randrange(0, 60))]
        seed = rng.choice([None, rng.randrange(2**62)])
        prompt = [
            PromptIds(ids, json.dumps(ids, separators=(",", ":"))),
            list(ids),
            tuple(ids),
            [np.int64(t) for t in ids],
        ][case % 4]
        want = completion_payload('m"odel', ids, params, seed)
        head = fields_json(completion_fields('m"odel', params, seed))
        assert json.loads(body_with_prompt(head, prompt_json(prompt))) == want
        batch = json.loads(body_with_prompt(head, f"[{prompt_json(prompt)},{prompt_json(ids[:3])}]"))
        assert batch == {**want, "prompt": [ids, ids[:3]]}
    # equal settings give equal heads (a batch's key), other settings other heads
    assert fields_json(completion_fields("m", SamplingParams(top_k=0))) == fields_json(
        completion_fields("m", SamplingParams())
    )
    assert fields_json(completion_fields("m", SamplingParams(max_tokens=5))) != fields_json(
        completion_fields("m", SamplingParams())
    )


@pytest.mark.timeout(60)
def test_a_builders_held_ids_go_out_as_they_are() -> None:
    """Turns of growing held ids (``TrajectoryBuilder.held_ids()``, JSON kept turn by turn), batched and alone: the
    server receives exactly the ids, with the same fields as ``completion_payload``."""
    from ep_trl.trajectory.tokens import TrajectoryBuilder

    async def turns(generator: VLLMServerGenerator, builders: "list[TrajectoryBuilder]") -> list[int]:
        try:
            for turn in range(3):
                prompts = [b.held_ids() for b in builders]
                results = await asyncio.gather(*(generator.generate(c, SamplingParams(max_tokens=3)) for c in prompts))
                for b, r in zip(builders, results):
                    b.add_sampled(r)
                    b.add_inserted([100 + turn, 101])
            return builders[0].held_ids()
        finally:
            await generator.aclose()

    for window in (0.05, 0):
        with FaultyVLLMServer(ok_token_ids=(7, 8, 9)) as server:
            generator = VLLMServerGenerator(server.url, replace(FAST, batch_window_s=window))
            builders = [TrajectoryBuilder(tuple(range(i, i + 5))) for i in range(4)]
            final = run(turns(generator, builders))
            sent = server.prompts
        assert len(sent) == 12
        for turn in range(3):
            expected = sorted(list(b.prompt_ids) + b.completion_ids[: turn * 5] for b in builders)
            assert sorted(p for p, _ in sent[turn * 4 : turn * 4 + 4]) == expected
        fields = {
            k: v
            for k, v in completion_payload(generator.model, [], SamplingParams(max_tokens=3)).items()
            if k != "prompt"
        }
        assert all(f == fields for _, f in sent)
        assert final == [0, 1, 2, 3, 4, 7, 8, 9, 100, 101, 7, 8, 9, 101, 101, 7, 8, 9, 102, 101]


@pytest.mark.timeout(30)
def test_a_request_runs_in_the_turns_own_task(monkeypatch: pytest.MonkeyPatch) -> None:
    """The request's deadline is asyncio.timeout's: no task per request (wait_for's), the exchange runs in the turn's
    task; a hung exchange still times out (test_hung_request_is_retried_then_fails_naming_the_request)."""
    import ep_trl.generation.vllm as vllm

    seen: "list[asyncio.Task[Any] | None]" = []

    async def exchange(client: "aiohttp.ClientSession", url: str, body: bytes) -> tuple[int, str]:
        seen.append(asyncio.current_task())
        return 200, '{"choices": [{"index": 0, "token_ids": [5], "logprobs": {"token_logprobs": [-0.1]}}]}'

    monkeypatch.setattr(vllm, "_exchange", exchange)

    async def turn(generator: VLLMServerGenerator) -> "tuple[asyncio.Task[Any] | None, Generation]":
        try:
            return asyncio.current_task(), await generator.generate([1, 2], SamplingParams(max_tokens=2))
        finally:
            await generator.aclose()

    with FaultyVLLMServer() as server:
        task, result = run(turn(VLLMServerGenerator(server.url, replace(FAST, batch_window_s=0))))
    assert seen == [task] and result.token_ids == (5,)


@pytest.mark.timeout(30)
def test_request_fields_are_built_once_per_model_and_settings() -> None:
    """Unseeded turns with equal settings reuse one fields dict and its JSON, equal to what completion_fields builds;
    other settings, another model or a seed build their own; a turn's settings are themselves when its budget is
    theirs already."""
    from ep_trl.generation.vllm_wire import completion_fields, fields_json

    with FaultyVLLMServer() as server:
        generator = VLLMServerGenerator(server.url, FAST)
    params = SamplingParams(temperature=0.7, max_tokens=9, stop=("\n",))
    first = generator.request_fields("m", params, None)
    assert first == (completion_fields("m", params), fields_json(completion_fields("m", params)))
    assert generator.request_fields("m", SamplingParams(temperature=0.7, max_tokens=9, stop=("\n",)), None) is first
    assert generator.request_fields("m", params.with_max_tokens(8), None)[0]["max_tokens"] == 8
    assert generator.request_fields("other", params, None)[0]["model"] == "other"
    seeded = generator.request_fields("m", params, 17)
    assert seeded[0] == completion_fields("m", params, 17) and seeded[0]["seed"] == 17
    assert params.with_max_tokens(9) is params and params.with_max_tokens(3).max_tokens == 3
    for n in range(300):  # bounded
        generator.request_fields("m", params.with_max_tokens(n + 1), None)
    assert len(generator._fields) <= 256
