"""The chosen eval of issue 47 in CI: ``recipes/frozen_lake/smollm2.yaml`` (eval-protocol's own FrozenLake benchmark,
``eval_protocol.benchmarks.test_frozen_lake``, its MCP server and scoring body unchanged) through ``ep-trl train``
and the recipe's own flags, at tiny sizes: the tiny model in place of SmolLM2, warm-started on demonstrations,
2 GRPO steps with a non-zero gradient.

Every lake's shortest path is 6 moves, more than the tiny model learns to play on lakes it has not seen. So the test
trains on 2 lakes of the recipe's own rows, and its demonstrations are the scripted expert's shortest paths on those 2
lakes, one episode each, committed as ``tests/fixtures/frozen_lake_expert_demonstrations.jsonl``: recorded by
``python -m ep_trl.devtools.record_demonstrations FROZEN_LAKE --out FILE --input-dataset LAKES --player
ep_trl.devtools.frozen_lake_rows:shortest_path_move`` on the 2 rows (the recorder on FrozenLake is tested in
``tests/devtools/test_record_demonstrations.py``; the first test below checks every recorded move is the expert's).
The tiny model learns them by heart in its warm start (45 epochs at 5e-3, one demonstration an optimizer step: loss
6.51 -> 0.0098 per token, the same 0.01 as the 150 epochs at 1e-3 on 8 demonstrations this test ran before, in a
quarter of the tokens; with the recipe's 1,024-token cut the demonstrations lost their last moves, and the model never
learned to finish). Sampled at temperature 0.85, some episodes follow the path to the goal and some stray, so a
group's scores differ. This is a test of the pipeline (the recipe's template, warm start, local CPU vLLM server,
MCP-gym episodes on their rows' lakes, steps with a gradient), not of learning to read the lake
(``docs/benchmarks.md``). The 16 episodes of a step are played at once (``--max-concurrent-rollouts 16``, the
benchmark's own 3 otherwise): the vLLM server batches their turns.

The chance of no gradient in both steps: as printed (6 runs at these sizes, 3 of the test and 3 of its command by hand
on the same tokens; no result file), the step means were 0.19 and 0.50, 0.25 and 0.31, 0.38 and 0.25, 0.31 and 0.38,
0.13 and 0.44, 0.25 and 0.31. A group of 8 episodes with success rate p scores alike with chance p^8 + (1-p)^8, so all 4
groups (2 steps of 2 lakes) alike with each step's own rate is at most 2.5e-5 in those runs
(``ep_trl.devtools.doors_houses.no_gradient_chance``). Stricter: until a step has a gradient the weights are unchanged,
so both steps sample the warm-started policy, the same in every run (the warm start is seeded: the same losses each
time); its rate, pooled over the 96 first-step episodes, is 0.25, and all 4 groups alike (0.25^8 + 0.75^8)^4, about 1e-4
(0.0008 at p = 0.2; were every group's rate as low as 0.1, it would be 0.03).

Time (2 shared cores, another test run beside it: load 3 to 5): the training command took 105 to 121 s, of which the
warm start 18 to 21 s, the vLLM server's start 36 to 45 s and the 2 steps about 45 s. The test used 83 to 86 CPU
seconds (``/usr/bin/time`` on pytest, less the 17 s pytest takes to start), about its wall time on a quiet machine:
the version that recorded 8 demonstrations and warm-started 150 epochs on them used some 263 (248 the training
command's; at load 8 to 11, 187 s of its 341 s the warm start) and took 268 s in a quiet full-suite run."""

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
#: The scripted expert's episodes on those 2 lakes, one each, recorded by the command the module docstring gives.
DEMONSTRATIONS = ROOT / "tests" / "fixtures" / "frozen_lake_expert_demonstrations.jsonl"


def test_the_demonstrations_are_the_experts_moves_on_the_trained_lakes() -> None:
    """The committed demonstrations are what ``record_demonstrations --player ...shortest_path_move`` writes on
    ``LAKE_IDS``: one episode per lake, every turn one ``lake_move`` call, the expert's move on the lake the messages
    before it show, ending on the goal (the environment's reward 1)."""
    from ep_trl.cli.demonstrations import read_demonstrations
    from ep_trl.devtools.frozen_lake_rows import shortest_path_move

    lines = [json.loads(line) for line in DEMONSTRATIONS.read_text().splitlines()]
    assert [line["row_id"] for line in lines] == list(LAKE_IDS)
    for line in lines:
        messages = line["messages"]
        turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        assert turns and [t["function"]["name"] for t in line["tools"]] == ["lake_move"]
        for i in turns:
            (call,) = messages[i]["tool_calls"]
            assert call["function"]["name"] == "lake_move"
            assert json.loads(call["function"]["arguments"])["action"] == shortest_path_move(messages[:i])
        assert max(m.get("control_plane_step", {}).get("reward", 0) for m in messages) == 1  # the goal reached
    assert len(read_demonstrations(DEMONSTRATIONS).lines) == 2  # the warm start reads them as they are


@pytest.mark.timeout(540)
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
        str(DEMONSTRATIONS),
        "--warm-start-epochs",
        "45",
        "--warm-start-learning-rate",
        "5e-3",
        "--warm-start-batch-size",
        "1",
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
        "--max-concurrent-rollouts",
        "16",
        "--time-budget-s",
        "3600",
        "--output-dir",
        str(folder),
    ]
    proc = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=480)
    (tmp_path / "stdout.txt").write_text(proc.stdout)  # the phases' lines: warm start, vLLM server, steps
    (tmp_path / "stderr.txt").write_text(proc.stderr)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads((folder / "result.json").read_text())
    steps = result["steps_logged"]
    print(
        "scores per step:", [s["rewards/eval_score/mean"] for s in steps], "grad_norm:", [s["grad_norm"] for s in steps]
    )
    assert result["ended"] == "finished" and [s["step"] for s in steps] == [1, 2]
    assert result["env_path"] == FROZEN_LAKE
    assert result["warm_start"]["lines"] == 2 and result["warm_start"]["tokens_trained"] > 0
    assert result["warm_start"]["tokens_cut"] == 0  # every move kept (2,048 tokens, not the recipe's 1,024)
    assert any(s["grad_norm"] > 0 for s in steps), steps  # the policy got a gradient
    assert not port_taken(MCP_PORT), "the run left its MCP server on port 9700"
