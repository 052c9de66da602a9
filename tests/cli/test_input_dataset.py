"""``ep-trl train --input-dataset``: eval-protocol's own FrozenLake benchmark, as installed, trained from a directory
that is not eval-protocol's checkout: its rows from a file of our own, read through the eval's own adapter, and its
MCP server found beside the installed package. Bad input is refused before anything starts."""

import json
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil
import pytest

from ep_trl.cli import train
from ep_trl.cli.rows import split_rows
from ep_trl.evalprotocol import StoreLogger
from tests.sources.test_processor import stop_mcp_gym_shared_server

if TYPE_CHECKING:
    from collections.abc import Callable

ROOT = Path(__file__).resolve().parents[2]
FROZEN_LAKE = "eval_protocol.benchmarks.test_frozen_lake::test_frozen_lake_evaluation"
#: Our own wording of the game, in the record format the benchmark's dataset_adapter reads (not eval-protocol's text).
SYSTEM = (
    "Cross the frozen pond on the map. S: where you start. F: firm ice. H: a hole that ends the walk. G: the "
    "far bank. Each call of lake_move takes one step: LEFT, DOWN, RIGHT or UP."
)
PONDS: list[dict[str, Any]] = [
    {
        "id": f"pond-{seed}",
        "system_prompt": SYSTEM,
        "user_prompt_template": "The pond:\n{observation}\nYour step?",
        "environment_context": {"game": "FrozenLake", "map_name": "4x4", "seed": seed},
    }
    for seed in (501, 502)
]
#: eval-protocol's FrozenLake MCP server listens here, whatever the eval says.
MCP_PORT = 9700


def write_ponds(path: Path) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in PONDS))
    return path


def port_taken(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.timeout(300)
def test_eval_protocols_frozen_lake_trains_on_rows_of_our_own_outside_its_checkout(
    qwen_template_model_dir: Path, tmp_path: Path
) -> None:
    """The whole run from a YAML config and ENV_PATH alone, in tmp_path: one GRPO step whose episodes all finished
    (played on the MCP server that the eval names relative to eval-protocol's repository, started from
    site-packages) on the rows of our file; the server is gone when the run ends."""
    import eval_protocol

    assert not port_taken(MCP_PORT), "another FrozenLake MCP server holds port 9700"
    write_ponds(tmp_path / "ponds.jsonl")
    (tmp_path / "frozen_lake.yaml").write_text(
        f"model: {qwen_template_model_dir}\ninput_dataset: [ponds.jsonl]\nmax_steps: 1\n"
        "per_device_train_batch_size: 4\nnum_generations: 2\nmax_completion_length: 48\noutput_dir: run\n"
        "log_home: store\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "ep_trl.cli", "train", FROZEN_LAKE, "--config", "frozen_lake.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"input dataset: 2 rows from {tmp_path / 'ponds.jsonl'}" in proc.stdout
    server = Path(eval_protocol.__file__).resolve().parent / "mcp_servers" / "frozen_lake" / "server.py"
    assert (
        f"its server_script_path 'eval_protocol/mcp_servers/frozen_lake/server.py' is not in the working "
        f"directory ({tmp_path}); using {server}"
    ) in proc.stderr
    # the processor writes its server's output to the working directory: the server ran, from that script, and
    # built the lakes of our rows' seeds
    server_log = (tmp_path / "server_output_server_9700.log").read_text()
    assert "Starting FrozenLake MCP server on port 9700" in server_log
    assert all(f"Generating map with seed {row['environment_context']['seed']}" in server_log for row in PONDS)
    [step] = [
        json.loads(line)
        for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
        if "ep_trl/failed_fraction" in json.loads(line)
    ]
    assert (step["ep_trl/failed_fraction"], step["ep_trl/unscored_fraction"]) == (0.0, 0.0)
    assert step["ep_trl/mean_turns"] >= 1
    logged = StoreLogger(tmp_path / "store" / ".eval_protocol" / "logs.db").read()
    assert len(logged) == 4 and {row.input_metadata.row_id for row in logged} == {"pond-501", "pond-502"}
    assert all(row.messages[0].content == SYSTEM and row.evaluation_result is not None for row in logged)
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert (result["ended"], result["steps"]) == ("finished", 1)
    assert not port_taken(MCP_PORT), "the run left its MCP server on port 9700"


@pytest.mark.parametrize(
    "args, message",
    [
        pytest.param(
            lambda t: [FROZEN_LAKE, "--input-dataset", str(t / "missing.jsonl")],
            r"--input-dataset .*missing\.jsonl: input dataset '.*missing\.jsonl': no such file",
            id="missing",
        ),
        pytest.param(
            lambda t: ["tests.evals.eval_frozen_lake", "--input-dataset", str(write_ponds(t / "p.jsonl"))],
            r"reads its rows from input_rows, not from an input_dataset with a dataset_adapter.*Drop the input "
            r"dataset",
            id="eval-with-inline-rows",
        ),
        pytest.param(
            lambda t: [FROZEN_LAKE],
            r"ENV_PATH .*: .*its input_dataset 'tests/pytest/data/frozen_lake_dataset\.jsonl' is relative and "
            r"does not exist at .*\(from the working directory\) and .*site-packages/tests/pytest/data/"
            r"frozen_lake_dataset\.jsonl \(from the root its module .*ep-trl train --input-dataset FILE\.jsonl",
            id="eval-dataset-nowhere",
        ),
    ],
)
def test_a_dataset_that_cannot_be_read_is_refused_before_anything_starts(
    args: "Callable[[Path], list[str]]",
    message: str,
    qwen_template_model_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    argv = args(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(ROOT))  # tests.evals, imported by name from tmp_path
    with pytest.raises(SystemExit) as exit_info:
        train.main(argv + ["--model", str(qwen_template_model_dir), "--output-dir", str(tmp_path / "run")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert re.search(message, err, flags=re.S), err
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before
    assert not (tmp_path / "run").exists() and not port_taken(MCP_PORT)
    stop_mcp_gym_shared_server()  # nothing started it; a leak would stay for the next test otherwise


def test_input_dataset_files_are_split_at_commas_and_made_absolute(
    qwen_template_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Several files, as separate words or comma-separated, in the order given; absolute, so that every process of
    the run reads the same files."""
    monkeypatch.chdir(tmp_path)
    for name in ("a.jsonl", "b.jsonl", "c.jsonl"):
        write_ponds(tmp_path / name)
    argv = [FROZEN_LAKE, "--model", str(qwen_template_model_dir), "--input-dataset", "a.jsonl,b.jsonl", "c.jsonl"]
    parser = train.make_parser()
    (namespace,) = parser.parse_args_and_config(argv)
    job = train.plan(parser, vars(namespace), train.Preset(prog=train.PROG, title=""), argv)
    assert job.overrides.input_dataset == tuple(str(tmp_path / name) for name in ("a.jsonl", "b.jsonl", "c.jsonl"))
    rows, _ = split_rows(job)
    assert len(rows) == 6
