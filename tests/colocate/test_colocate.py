"""An eval trains with TRL's colocated vLLM engine (``vllm_mode="colocate"``) through ``env_path`` alone,
token-exact and on-policy: the engine inside the trainer's process (built by TRL, weights pushed by TRL before each
call, through ``CPUColocateGRPOTrainer`` on CPU), real ``train()`` steps, the letters eval and a processor eval."""

import asyncio
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pytest
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig

from ep_trl import ConfigError, create_rollout_func, dataset_from_eval
from ep_trl.generation import SamplingParams
from ep_trl.generation.colocate import ColocateGenerator
from ep_trl.options import VLLMOptions
from ep_trl.rewards import eval_score
from ep_trl.trainers.cpu_colocate import CPUColocateGRPOTrainer
from tests.support.references import teacher_forced_logprobs
from tests.support.trainers import PROMPT, WeightSnapshots, assert_trained

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    import torch
    from transformers import TrainerCallback
    from vllm import LLM

    from ep_trl.adapters.rollout_func import RolloutFunction
    from ep_trl.adapters.sharded import ShardedRolloutFunction
    from ep_trl.generation import Generation, PromptImages


LETTERS = "tests.evals.eval_letters::test_letters_pointwise"
ARITHMETIC = "tests/evals/eval_arithmetic.py::test_arithmetic"
TOLERANCE = 1e-3
TEMPERATURE = 0.8


@pytest.fixture(scope="module")
def model_dir(sharp_model_dir: Path) -> Path:
    return sharp_model_dir


def colocate_trainer(
    model_dir: Path,
    out_dir: Path,
    rollout: "RolloutFunction | ShardedRolloutFunction",
    prompts: list[str],
    callbacks: "Sequence[TrainerCallback]" = (),
    **config: Any,
) -> CPUColocateGRPOTrainer:
    args = GRPOConfig(
        output_dir=str(out_dir),
        use_cpu=True,
        bf16=False,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=256,
        logging_steps=1,
        report_to=[],
        learning_rate=3e-3,
        save_strategy="no",
        seed=0,
        temperature=TEMPERATURE,
        use_vllm=True,
        vllm_mode="colocate",
        vllm_max_model_length=1024,
        **{"max_steps": 2, **config},
    )
    return CPUColocateGRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(model_dir),
        reward_funcs=[eval_score],
        args=args,
        train_dataset=Dataset.from_dict({"prompt": prompts}),
        processing_class=AutoTokenizer.from_pretrained(model_dir),
        rollout_func=rollout,
        callbacks=list(callbacks),
    )


def max_gap(model: "torch.nn.Module", out: dict[str, list[Any]], temperature: float) -> float:
    """The largest difference between a returned sampled-token logprob and the model's teacher-forced one; inserted
    tokens must carry logprob 0."""
    model.eval()
    worst = 0.0
    for p, c, lps, mask in zip(out["prompt_ids"], out["completion_ids"], out["logprobs"], out["env_mask"]):
        reference = teacher_forced_logprobs(model, p, c, temperature)
        assert all(lp == 0.0 for lp, m in zip(lps, mask) if not m)
        worst = max([worst] + [abs(lp - ref) for lp, ref, m in zip(lps, reference, mask) if m])
    return worst


@pytest.mark.timeout(600)
def test_the_letters_eval_trains_on_policy_with_the_colocated_engine(
    model_dir: Path, letters_server: str, tmp_path: Path
) -> None:
    """The rollout generates with the trainer's own engine (not its model, not a server); TRL pushes the trainer's
    weights into it before each step's rollouts, so TRL's own check stays at rounding level, and afterwards the
    engine samples from the weights after step 2 (the last push, before step 3's rollouts), not the initial ones."""
    snapshots = WeightSnapshots()
    rollout = cast("RolloutFunction", create_rollout_func(LETTERS, log_rollouts=False))  # unsharded
    trainer = colocate_trainer(model_dir, tmp_path, rollout, [PROMPT] * 8, callbacks=[snapshots], max_steps=3)
    initial = AutoModelForCausalLM.from_pretrained(model_dir)
    try:
        out = rollout([PROMPT] * 4, trainer)  # before training: the engine holds the initial weights
        assert rollout.backend_name == "vllm-colocate"
        assert out["episode_status"] == ["finished"] * 4 and out["num_turns"] == [3] * 4
        assert max_gap(initial, out, TEMPERATURE) < TOLERANCE
        trainer.train()
        steps = [h for h in trainer.state.log_history if "sampling/sampling_logp_difference/max" in h]
        assert [h["step"] for h in steps] == [1, 2, 3]
        assert all(h["sampling/sampling_logp_difference/max"] < TOLERANCE for h in steps)
        assert all(h["ep_trl/failed_fraction"] == 0.0 for h in steps)
        assert_trained(trainer)
        out = rollout([PROMPT] * 4, trainer)
    finally:
        rollout.close()
    step2 = AutoModelForCausalLM.from_pretrained(model_dir)
    step2.load_state_dict(snapshots.states[2])
    assert max_gap(step2, out, TEMPERATURE) < TOLERANCE
    assert max_gap(initial, out, TEMPERATURE) > 10 * TOLERANCE  # the engine's weights changed with training


@pytest.mark.timeout(600)
def test_a_processor_eval_trains_with_the_colocated_engine(model_dir: Path, tmp_path: Path) -> None:
    """SingleTurnRolloutProcessor runs unchanged; its calls are generated by the colocated engine, token-exactly."""
    prompts = [p for p in dataset_from_eval(ARITHMETIC)["prompt"] for _ in range(4)]
    rollout = create_rollout_func(ARITHMETIC, log_rollouts=False)
    trainer = colocate_trainer(model_dir, tmp_path, rollout, prompts)
    try:
        out = rollout(prompts[:4], trainer)
        assert out["episode_status"] == ["finished"] * 4 and all(all(mask) for mask in out["env_mask"])
        assert trainer.model is not None
        assert max_gap(trainer.model, out, TEMPERATURE) < TOLERANCE
        trainer.train()
    finally:
        rollout.close()
    steps = [h for h in trainer.state.log_history if "sampling/sampling_logp_difference/max" in h]
    assert [h["step"] for h in steps] == [1, 2]
    assert all(
        h["sampling/sampling_logp_difference/max"] < TOLERANCE and h["ep_trl/failed_fraction"] == 0.0 for h in steps
    )
    assert_trained(trainer)


@pytest.fixture(scope="module")
def single_process() -> None:
    """What TRL sets before it builds a colocated engine (vLLM's external launcher reads it): one process; and the
    KV cache size CPUColocateGRPOTrainer sets."""
    from ep_trl.runtime.processes import free_port

    for name, value in (
        ("RANK", "0"),
        ("LOCAL_RANK", "0"),
        ("WORLD_SIZE", "1"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", str(free_port())),
        ("VLLM_CPU_KVCACHE_SPACE", "1"),
    ):
        os.environ.setdefault(name, value)


@pytest.fixture(scope="module")
def engine(model_dir: Path, single_process: None) -> "Iterator[LLM]":
    """A vLLM engine built as CPUColocateGRPOTrainer builds TRL's (float32, eager), for the backend alone."""
    from vllm import LLM

    llm = LLM(
        model=str(model_dir),
        dtype="float32",
        enforce_eager=True,
        max_model_len=256,
        max_num_seqs=8,
        gpu_memory_utilization=0.3,
        distributed_executor_backend="external_launcher",
        logprobs_mode="processed_logprobs",
        seed=0,
    )
    yield llm
    del llm


def generate_all(
    generator: ColocateGenerator,
    requests: "Sequence[tuple[Sequence[int], SamplingParams]]",
    images: "PromptImages | None" = None,
) -> "list[Generation | BaseException]":
    async def main() -> "list[Generation | BaseException]":
        try:
            return await asyncio.gather(
                *(generator.generate(ids, params, images=images) for ids, params in requests), return_exceptions=True
            )
        finally:
            await generator.aclose()

    return asyncio.run(main())


@pytest.mark.timeout(300)
def test_concurrent_turns_share_engine_calls_each_with_its_own_settings(engine: "LLM", model_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    prompt = tokenizer.encode("Play the letters game.", add_special_tokens=False)
    requests = [(prompt, SamplingParams(temperature=TEMPERATURE, max_tokens=3 + k)) for k in range(6)]
    generator = ColocateGenerator(engine, VLLMOptions(batch_window_s=0.05, seed=7))
    results = generate_all(generator, requests)
    assert generator.engine_calls < len(requests) and generator.turns == len(requests)  # batched
    for (ids, params), result in zip(requests, results):
        assert not isinstance(result, BaseException)
        assert len(result.token_ids) <= params.max_tokens  # each turn's own limit
        reference = teacher_forced_logprobs(model, ids, result.token_ids, TEMPERATURE)
        assert max(abs(a - b) for a, b in zip(result.logprobs, reference)) < TOLERANCE


@pytest.mark.timeout(300)
def test_a_prompt_the_engine_cannot_take_fails_its_turn_alone(engine: "LLM") -> None:
    generator = ColocateGenerator(engine, VLLMOptions(batch_window_s=0.05))
    params = SamplingParams(temperature=1.0, max_tokens=4)
    results = generate_all(generator, [([5] * 300, params), ([5, 6, 7], params), ([10**9], params)])
    too_long, fine, out_of_vocabulary = results
    assert "max_model_len 256" in str(too_long) and "outside the vocabulary" in str(out_of_vocabulary)
    assert not isinstance(fine, BaseException)
    assert len(fine.token_ids) >= 1 and generator.failure is None  # the engine goes on


def test_sleep_mode_is_refused_on_cpu(model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="vllm_enable_sleep_mode.*no sleep mode on CPU"):
        colocate_trainer(
            model_dir,
            tmp_path,
            create_rollout_func(LETTERS, log_rollouts=False),
            [PROMPT] * 8,
            vllm_enable_sleep_mode=True,
        )


@pytest.mark.timeout(300)
def test_a_turn_with_images_samples_with_the_pixels_on_the_colocated_engine(
    tiny_vlm_dir: Path, single_process: None
) -> None:
    """A vision-language model's turn goes to the engine as vLLM takes it (the unexpanded prompt with the images as
    multi_modal_data); the engine's expansion is checked against the trainer processor's, and the sampled logprobs
    are the model's with the pixels, far from its logprobs without them."""
    from transformers import AutoModelForImageTextToText, AutoProcessor
    from vllm import LLM

    from ep_trl.generation import PromptImages
    from ep_trl.trajectory.template import ChatTemplate
    from tests.support.images import png_data_uri, token_logprobs, user_with_image

    processor = AutoProcessor.from_pretrained(tiny_vlm_dir)
    model = AutoModelForImageTextToText.from_pretrained(tiny_vlm_dir).eval()
    prompt = ChatTemplate(processor).prompt(
        [
            user_with_image("Step 1", png_data_uri((255, 0, 0))),
            {"role": "assistant", "content": "click('13')"},
            user_with_image("Step 2", png_data_uri((0, 0, 255), (64, 48))),
        ]
    )
    llm = LLM(
        model=str(tiny_vlm_dir),
        dtype="float32",
        enforce_eager=True,
        max_model_len=1024,
        max_num_seqs=4,
        gpu_memory_utilization=0.3,
        distributed_executor_backend="external_launcher",
        logprobs_mode="processed_logprobs",
        seed=0,
        limit_mm_per_prompt={"image": 8},
    )
    generator = ColocateGenerator(llm, VLLMOptions(seed=0))
    [turn] = generate_all(
        generator,
        [(prompt.ids, SamplingParams(max_tokens=8))],
        images=PromptImages(prompt.images, prompt.unexpanded_ids),
    )
    assert not isinstance(turn, BaseException)
    ids, n = list(prompt.ids) + list(turn.token_ids), len(prompt.ids)
    with_pixels = token_logprobs(model, processor, ids, list(prompt.images))[n - 1 :]
    without = token_logprobs(model, processor, ids, list(prompt.images), pixels=False)[n - 1 :]
    assert len(turn.token_ids) >= 1
    assert max(abs(a - b) for a, b in zip(with_pixels, turn.logprobs)) < TOLERANCE
    assert max(abs(a - b) for a, b in zip(without, turn.logprobs)) > 100 * TOLERANCE
