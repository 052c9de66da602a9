"""The chosen eval of issue 47 in CI: ``recipes/frozen_lake/smollm2.yaml`` (eval-protocol's own FrozenLake benchmark,
``eval_protocol.benchmarks.test_frozen_lake``, its MCP server and scoring body unchanged) through ``ep-trl train``
and the recipe's own flags, at tiny sizes: the tiny model in place of SmolLM2, warm-started on demonstrations,
2 GRPO steps with a non-zero gradient.

Every lake's shortest path is 6 moves, more than the tiny model learns to play on lakes it has not seen. So the test
trains on 2 lakes of the recipe's own rows, and its demonstrations are the scripted expert's shortest paths on those 2
lakes (``record_demonstrations --player``), which the tiny model learns by heart in its warm start (150 epochs, loss
about 0.01 per token; with the recipe's 1,024-token cut the demonstrations lost their last moves, and the model never
learned to finish). Sampled at temperature 0.85, some episodes follow the path to the goal and some stray, so a
group's scores differ. This is a test of the pipeline (the recipe's template, warm start, local CPU vLLM server,
MCP-gym episodes on their rows' lakes, steps with a gradient), not of learning to read the lake
(``docs/benchmarks.md``).

The chance of no gradient in both steps: as the test printed them (one run each, no result file), the step mean was
0.06 and 0.0 at temperature 1 (too few goals), 0.94 and 0.88 at 0.7 (too many), 0.19 and 0.50 at 0.85. A group of 8
episodes with success rate p scores alike with chance p^8 + (1-p)^8: 0.19 at p = 0.19 and 0.008 at p = 0.5, so all 4
groups (2 steps of 2 lakes) alike about 0.19^2 x 0.008^2, below 1e-5; were every group's rate as low as 0.1, it would
be 0.43^4, about 0.03."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.test_input_dataset import MCP_PORT, port_taken

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes" / "frozen_lake" / "smollm2.yaml"
FROZEN_LAKE = "eval_protocol.benchmarks.test_frozen_lake::test_frozen_lake_evaluation"
LAKE_IDS = ("lake-1", "lake-2")  # two rows of the recipe's lakes (seeds 1 and 2)


@pytest.mark.timeout(900)
def test_the_frozen_lake_recipe_trains_two_steps_with_a_gradient(qwen_template_model_dir: Path, tmp_path: Path) -> None:
    assert not port_taken(MCP_PORT), "another FrozenLake MCP server holds port 9700"
    rows = [
        line
        for line in (ROOT / "recipes" / "frozen_lake" / "lakes.jsonl").read_text().splitlines()
        if json.loads(line)["id"] in LAKE_IDS
    ]
    assert len(rows) == 2
    lakes = tmp_path / "lakes.jsonl"
    lakes.write_text("\n".join(rows) + "\n")
    demonstrations = tmp_path / "demonstrations.jsonl"
    record = subprocess.run(
        [
            sys.executable,
            "-m",
            "ep_trl.devtools.record_demonstrations",
            FROZEN_LAKE,
            "--out",
            str(demonstrations),
            "--player",
            "ep_trl.devtools.frozen_lake_rows:shortest_path_move",
            "--input-dataset",
            str(lakes),
            "--repeat",
            "4",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert record.returncode == 0, record.stderr[-3000:]
    assert len(demonstrations.read_text().splitlines()) == 8
    folder = tmp_path / "run"
    argv = [
        sys.executable,
        "-m",
        "ep_trl.cli",
        "train",
        "--config",
        str(RECIPE),
        "--model",
        str(qwen_template_model_dir),
        "--input-dataset",
        str(lakes),
        "--warm-start",
        str(demonstrations),
        "--warm-start-epochs",
        "150",
        "--warm-start-learning-rate",
        "1e-3",
        "--warm-start-max-length",
        "2048",
        "--held-out",
        "0",
        "--max-steps",
        "2",
        "--num-generations",
        "8",
        "--per-device-train-batch-size",
        "8",
        "--gradient-accumulation-steps",
        "2",
        "--max-completion-length",
        "1024",
        "--learning-rate",
        "1e-4",
        "--temperature",
        "0.85",
        "--time-budget-s",
        "3600",
        "--output-dir",
        str(folder),
    ]
    proc = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=780)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads((folder / "result.json").read_text())
    steps = result["steps_logged"]
    print(
        "scores per step:", [s["rewards/eval_score/mean"] for s in steps], "grad_norm:", [s["grad_norm"] for s in steps]
    )
    assert result["ended"] == "finished" and [s["step"] for s in steps] == [1, 2]
    assert result["env_path"] == FROZEN_LAKE
    assert result["warm_start"]["lines"] == 8 and result["warm_start"]["tokens_trained"] > 0
    assert any(s["grad_norm"] > 0 for s in steps), steps  # the policy got a gradient
    assert not port_taken(MCP_PORT), "the run left its MCP server on port 9700"
