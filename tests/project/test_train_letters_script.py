"""The README's main job, as a user runs it: the CPU demo training script end to end, and with --async against a
real CPU vLLM server."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.trainers import assert_script_trained

ROOT = Path(__file__).resolve().parents[2]


def test_cpu_default_trains_and_prints_a_reward_line_per_step(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "recipes/letters/tiny.py"), "--max-steps", "2", "--output-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = re.findall(r"^step (\d)/2 \| reward ([0-9.]+)", proc.stdout, flags=re.M)
    assert [s for s, _ in steps] == ["1", "2"], proc.stdout
    assert all(0.0 <= float(r) <= 1.0 for _, r in steps)
    assert_script_trained(proc.stdout)
    assert re.search(
        r"^done: 2 steps, 32 episodes, reward first [0-9.]+ last [0-9.]+ \(mean eval score of steps 1 "
        r"and 2\)",
        proc.stdout,
        flags=re.M,
    ), proc.stdout
    assert (tmp_path / "tiny-model" / "config.json").exists()
    plot = tmp_path / "reward_curve.png"
    assert f"reward curve: {plot}" in proc.stdout and plot.read_bytes()[:4] == b"\x89PNG"


@pytest.fixture
def vllm_server_url(shared_vllm_url: str) -> str:
    """The session's real CPU vLLM server (``shared_vllm_server``), in dev mode (weights reloaded from disk), as trl
    vllm-serve runs. It starts on the sharp copy of the tiny model (same architecture and tokenizer): the script's
    first weight sync, before any episode, puts --model's weights on it ("pushed version-000001" below)."""
    return shared_vllm_url


@pytest.mark.timeout(900)
def test_async_trains_on_a_vllm_server_and_prints_a_reward_line_per_step(
    vllm_server_url: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """--async: CPUAsyncGRPOTrainer fed by EvalRolloutWorker, weights pushed to the server through disk
    (DiskWeightTransfer writes them to a temporary directory, never into --model's). Its log has no
    rewards/eval_score/mean: the step lines and the closing line read the worker's reward."""
    weights = (tiny_model_dir / "model.safetensors").read_bytes()
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "recipes/letters/tiny.py"),
            "--async",
            "--vllm-base-url",
            vllm_server_url,
            "--model",
            str(tiny_model_dir),
            "--max-steps",
            "2",
            "--output-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (
        f"generation: the vLLM server at {vllm_server_url}, by ep_trl's EvalRolloutWorker while training steps "
        "run (CPUAsyncGRPOTrainer" in proc.stdout
    ), proc.stdout
    # AsyncGRPOTrainer logs the worker's metrics with the step during which they arrived: the first step always has
    # its rollout call's, a later one only if a call ended while it ran (the worker plays ahead), so episodes/s is
    # asserted on the first line only.
    steps = re.findall(r"^step (\d)/2 \| reward ([0-9.]+) \(std [0-9.]+\) \|(.*)$", proc.stdout, flags=re.M)
    assert [s for s, _, _ in steps] == ["1", "2"], proc.stdout
    assert all(0.0 <= float(r) <= 1.0 for _, r, _ in steps)
    assert re.match(r" episodes/s [0-9.]+ \| failed", steps[0][2]), proc.stdout
    assert_script_trained(proc.stdout)
    assert re.search(r"^done: 2 steps, 32 episodes, reward first [0-9.]+ last [0-9.]+", proc.stdout, flags=re.M)
    assert (tmp_path / "reward_curve.png").exists()
    assert "pushed version-000001" in proc.stderr and "pushed version-000003" in proc.stderr  # the first sync (the
    # initial policy, before any episode), then one per step
    assert (tiny_model_dir / "model.safetensors").read_bytes() == weights
