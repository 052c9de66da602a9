"""Every result file in ``benchmarks/results/`` (``history/`` aside) says which committed code made it.

docs/benchmarks.md quotes these files; a figure stands on one only if the file's ``run`` record
(``ep_trl.devtools.run_record``) names a command that reruns from the repository, a commit of this branch's history
and a clean tree. Files measured on code that is not in the repository live in ``benchmarks/results/history/``
(its README.md says so) and are not checked. Needs a full git clone (CI has one): the commit check asks git.
"""

import json
import shlex
import subprocess
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import pytest

from ep_trl.devtools import run_record

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results"
HISTORY = RESULTS / "history"
FIELDS = ("command", "commit", "dirty", "started", "machine")


def result_files() -> list[Path]:
    return sorted(p for p in RESULTS.rglob("*") if p.is_file() and HISTORY not in p.parents)


def absolute_paths(command: str) -> list[str]:
    """The arguments of ``command`` (and ``--flag=`` values) that are absolute or home-relative paths."""
    values = [arg.partition("=")[2] if arg.startswith("-") and "=" in arg else arg for arg in shlex.split(command)]
    return [value for value in values if value.startswith(("/", "~"))]


def problems(path: Path, is_ancestor: Callable[[str], bool]) -> list[str]:
    """What is wrong with one result file's ``run`` record (empty: nothing)."""
    try:
        result = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        return [f"not JSON ({error})"]
    run = result.get("run") if isinstance(result, dict) else None
    if not isinstance(run, dict):
        return ["no `run` record: write it with ep_trl.devtools.run_record, or move the file to history/"]
    found = [f"no `{field}`" for field in FIELDS if field not in run]
    if found:
        return found
    if absolute_paths(run["command"]):
        found.append(
            f"the command names paths outside the repository {absolute_paths(run['command'])}: rerun it "
            f"with repository-relative paths"
        )
    if run["dirty"] is not False:
        found.append(f"dirty: {run['dirty']!r}: measured on uncommitted code; commit, then rerun on the clean tree")
    if not (isinstance(run["commit"], str) and len(run["commit"]) == 40):
        found.append(f"commit {run['commit']!r} is not a full commit hash")
    elif not is_ancestor(run["commit"]):
        found.append(f"commit {run['commit']} is not in this branch's history (HEAD's ancestors)")
    try:
        if datetime.fromisoformat(run["started"]).tzinfo is None:
            found.append(f"started {run['started']!r} has no time zone")
    except (TypeError, ValueError):
        found.append(f"started {run['started']!r} is not an ISO 8601 time")
    if not (isinstance(run["machine"], dict) and isinstance(run["machine"].get("cpus"), int)):
        found.append(f"machine {run['machine']!r} does not say its CPUs")
    return found


@pytest.fixture(scope="module")
def is_ancestor() -> Callable[[str], bool]:
    try:
        shallow = run_record.git(REPO, "rev-parse", "--is-shallow-repository")
    except run_record.NotACheckoutError as error:
        pytest.fail(
            f"{error} (the check of benchmarks/results asks git whether each file's commit is an ancestor of "
            f"HEAD; CI runs in a full clone)"
        )
    if shallow == "true":
        pytest.fail(
            "this checkout is shallow: the check of benchmarks/results needs the full history to tell whether "
            "each file's commit is an ancestor of HEAD (`git fetch --unshallow`; CI runs in a full clone)"
        )

    def check(commit: str) -> bool:
        return (
            subprocess.run(
                ["git", "-C", str(REPO), "merge-base", "--is-ancestor", commit, "HEAD"], capture_output=True
            ).returncode
            == 0
        )  # 1: not an ancestor; 128: no such commit

    return check


def test_every_result_file_names_a_clean_commit_of_this_history(is_ancestor: Callable[[str], bool]) -> None:
    files = result_files()
    assert files, f"no result files under {RESULTS}"
    bad = {path.relative_to(REPO).as_posix(): found for path in files if (found := problems(path, is_ancestor))}
    assert not bad, "result files that stand on nothing committed:\n" + "\n".join(
        f"  {name}: {'; '.join(found)}" for name, found in sorted(bad.items())
    )


def test_the_check_refuses_each_defect(tmp_path: Path) -> None:
    """Each requirement fails a file that breaks it alone (a check that passes everything would pass the test
    above too)."""
    good = {
        "command": "python benchmarks/x.py --out benchmarks/results/x.json",
        "commit": "a" * 40,
        "dirty": False,
        "started": "2026-01-01T00:00:00+00:00",
        "machine": {"cpus": 2},
    }
    cases = {
        "good": ({"run": good}, []),
        "no run": ({"runs": []}, ["no `run` record"]),
        "no commit": ({"run": {k: v for k, v in good.items() if k != "commit"}}, ["no `commit`"]),
        "dirty": ({"run": {**good, "dirty": True}}, ["dirty: True"]),
        "absolute out": ({"run": {**good, "command": "python benchmarks/x.py --out /tmp/x.json"}}, ["outside"]),
        "absolute flag value": ({"run": {**good, "command": "python x.py --model=/work/m"}}, ["outside"]),
        "short commit": ({"run": {**good, "commit": "abc1234"}}, ["not a full commit"]),
        "foreign commit": ({"run": {**good, "commit": "b" * 40}}, ["not in this branch's history"]),
        "naive date": ({"run": {**good, "started": "2026-01-01T00:00:00"}}, ["no time zone"]),
        "no cpus": ({"run": {**good, "machine": {}}}, ["CPUs"]),
    }
    for name, (result, expected) in cases.items():
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(result))
        found = problems(path, lambda commit: commit == "a" * 40)
        assert len(found) == len(expected) and all(e in f for e, f in zip(expected, found)), (name, found)
