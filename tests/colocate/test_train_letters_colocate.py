"""The letters training script with TRL's colocated engine, as a user runs it on CPU:
``.venv-colocate/bin/python recipes/letters/tiny.py --vllm-mode colocate`` (CPUColocateGRPOTrainer)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ep_trl.runtime.processes import free_port
from tests.support.trainers import assert_script_trained

ROOT = Path(__file__).resolve().parents[2]
DISTRIBUTED_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.mark.timeout(660)
def test_the_letters_script_trains_with_the_colocated_engine(tmp_path: Path) -> None:
    # a user's shell, not this test process's: TRL sets the rendezvous variables here when an earlier test builds a
    # colocated trainer (MASTER_PORT 29500 by default), and that trainer's process group still holds the port
    env = {k: v for k, v in os.environ.items() if k not in DISTRIBUTED_VARIABLES}
    env["MASTER_PORT"] = str(free_port())
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "recipes/letters/tiny.py"),
            "--vllm-mode",
            "colocate",
            "--max-steps",
            "2",
            "--output-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (
        "generation: TRL's colocated vLLM engine, in the training process (CPUColocateGRPOTrainer, CPU)" in proc.stdout
    ), proc.stdout
    steps = re.findall(r"^step (\d)/2 \| reward ([0-9.]+) .*\| eval_score ([0-9.]+)", proc.stdout, flags=re.M)
    assert [s for s, _, _ in steps] == ["1", "2"], proc.stdout
    assert all(0.0 <= float(r) <= 1.0 for _, r, _ in steps)
    assert_script_trained(proc.stdout)
    assert re.search(r"^done: 2 steps, 32 episodes, reward first [0-9.]+ last [0-9.]+", proc.stdout, flags=re.M)
    assert (tmp_path / "reward_curve.png").exists()
