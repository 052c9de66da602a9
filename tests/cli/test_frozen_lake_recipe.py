"""The chosen eval of issue 47 in CI: ``recipes/frozen_lake/smollm2.yaml`` (eval-protocol's own FrozenLake benchmark,
``eval_protocol.benchmarks.test_frozen_lake``, its MCP server and scoring body unchanged) through ``ep-trl train`` and
the recipe's own flags, at tiny sizes: the tiny model in place of SmolLM2, warm-started on the recipe's
demonstrations, 2 GRPO steps with a non-zero gradient, held-out lakes played before and after.

The chance of no gradient: the warm-started tiny model samples RIGHT and DOWN about as the demonstrations do, which
reach the goal on about 0.26 of the lakes within 8 moves (``benchmarks/results/frozen_lake_baselines.json``, "random
RIGHT/DOWN"); a group of 8 episodes all scores alike with chance 0.74^8 + 0.26^8 < 0.1, so 4 groups (2 steps of 2
lakes) all alike below 1e-4, if the sampling holds that rate (the test prints the scores it got)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes" / "frozen_lake" / "smollm2.yaml"


@pytest.mark.timeout(600)
def test_the_frozen_lake_recipe_trains_two_steps_with_a_gradient(qwen_template_model_dir, tmp_path):
    folder = tmp_path / "run"
    argv = [sys.executable, "-m", "ep_trl.cli", "train", "--config", str(RECIPE), "--model", str(qwen_template_model_dir),
            "--warm-start-epochs", "6", "--warm-start-learning-rate", "3e-3", "--max-steps", "2", "--held-out", "2",
            "--num-generations", "8", "--per-device-train-batch-size", "8", "--gradient-accumulation-steps", "2",
            "--max-completion-length", "768", "--learning-rate", "1e-3", "--time-budget-s", "3600",
            "--output-dir", str(folder)]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=560)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads((folder / "result.json").read_text())
    steps = result["steps_logged"]
    print("scores per step:", [s["rewards/eval_score/mean"] for s in steps], "grad_norm:", [s["grad_norm"] for s in steps])
    assert result["ended"] == "finished" and [s["step"] for s in steps] == [1, 2]
    assert result["env_path"] == "eval_protocol.benchmarks.test_frozen_lake::test_frozen_lake_evaluation"
    assert any(s["grad_norm"] > 0 for s in steps), steps  # the policy got a gradient
    assert result["warm_start"]["lines"] == 32 and result["warm_start"]["tokens_trained"] > 0
    assert result["held_out_rows"] == 2
    for when in ("before", "after"):
        rows = result[f"held_out_{when}_rows"]
        assert [row["row_id"] for row in rows] == [row["row_id"] for row in result["held_out_before_rows"]]
        figures = result[f"held_out_{when}_figures"]
        assert figures["episodes"] == 2 and 0 <= figures["success"] <= 1
    # the warm start taught the format: the held-out turns are calls of the benchmark's tool
    assert result["held_out_before_figures"]["well_formed_rate"] > 0.5, result["held_out_before_rows"]
