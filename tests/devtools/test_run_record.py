"""A result file's run record (``ep_trl.devtools.run_record``): a command that reruns from any checkout, and
``dirty`` exactly when a tracked file other than a result differs from the commit."""

import dataclasses
import json
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

from ep_trl.devtools import run_record


def git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True, capture_output=True
    )


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    (root / "src").mkdir(parents=True)
    (root / "benchmarks" / "results").mkdir(parents=True)
    (root / "src" / "code.py").write_text("x = 1\n")
    (root / "benchmarks" / "results" / "old.json").write_text("{}\n")
    git(root, "init", "-q")
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "code")
    return root


def test_the_command_names_repository_paths_relative_to_it(repo: Path) -> None:
    argv = [
        str(repo / "benchmarks" / "x.py"),
        "--out",
        str(repo / "benchmarks/results/x.json"),
        f"--model={repo}/models/../models/tiny",
        "--elsewhere",
        "/data/set",
        "relative/kept",
    ]
    record = run_record.start(repo, argv)
    assert record.command == (
        f"{Path(sys.executable).name} benchmarks/x.py --out benchmarks/results/x.json "
        f"--model=models/tiny --elsewhere /data/set relative/kept"
    )
    venv_python = str(repo / ".venv-vllm" / "bin" / "python")
    assert run_record.relative_command(repo, ["run.py"], venv_python) == ".venv-vllm/bin/python run.py"


def test_dirty_means_a_tracked_file_other_than_a_result_differs_from_the_commit(repo: Path) -> None:
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    clean = run_record.start(repo, ["x.py"])
    assert clean.commit == head and clean.dirty is False
    (repo / "outputs").mkdir()
    (repo / "outputs" / "new.json").write_text("{}")  # untracked output
    (repo / "benchmarks" / "results" / "old.json").write_text('{"rerun": 1}\n')  # a result rewritten
    (repo / "benchmarks" / "results" / "new.json").write_text("{}")
    assert run_record.start(repo, ["x.py"]).dirty is False
    (repo / "src" / "code.py").write_text("x = 2\n")
    assert run_record.start(repo, ["x.py"]).dirty is True
    git(repo, "checkout", "--", "src/code.py")
    git(repo, "rm", "-q", "--cached", "src/code.py")  # staged, not yet committed: still not the commit's code
    assert run_record.start(repo, ["x.py"]).dirty is True


def test_the_finished_record_has_what_the_results_check_needs(repo: Path) -> None:
    run = run_record.finish(run_record.start(repo, ["x.py"]))
    assert set(run) == {"command", "commit", "dirty", "started", "machine", "load_start", "load_end", "wall_s"}
    started = datetime.fromisoformat(run["started"])
    assert started.utcoffset() == timezone.utc.utcoffset(None)
    assert abs((datetime.now(timezone.utc) - started).total_seconds()) < 60
    assert run["machine"]["cpus"] >= 1 and len(run["load_start"]) == len(run["load_end"]) == 3
    assert run["wall_s"] >= 0


def test_a_start_kept_as_json_finishes_in_another_interpreter(repo: Path) -> None:
    """How a shell script records its run (benchmarks/vlm_async_walls.sh): the start as JSON, finished later."""
    start = run_record.start(repo, ["benchmarks/walls.sh", "6"], executable="/bin/bash")
    kept = json.loads(json.dumps(dataclasses.asdict(start)))
    run = run_record.finish(run_record.RunStart(**kept))
    assert run["command"] == "bash benchmarks/walls.sh 6" and run["commit"] == start.commit
    assert run["load_start"] == list(start.load_start) and run["wall_s"] >= 0


def test_a_directory_that_is_no_checkout_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(run_record.NotACheckoutError, match="run from a git clone"):
        run_record.start(tmp_path, ["x.py"])
