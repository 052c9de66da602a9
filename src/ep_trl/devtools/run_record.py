"""What a result file records about the run that made it, so that its figures can be traced to committed code and
rerun: the benchmarks in ``benchmarks/`` and the training scripts write it as their result's ``run`` entry, and
``tests/project/test_benchmark_results.py`` checks it on every file in ``benchmarks/results/``.

    record = run_record.start(REPO)                    # first thing in main()
    ...
    result = {"run": run_record.finish(record), ...}

A shell script keeps ``dataclasses.asdict(start(...))`` as JSON and finishes ``RunStart(**that)`` in a later
interpreter (``benchmarks/vlm_async_walls.sh``).

* ``command``: the command line, the interpreter's name first (or its path in the repository, as ``.venv-vllm/bin/
  python``), every absolute path inside the repository made relative to it, so that the command reruns from any
  checkout. A path outside it is kept as given, and the check refuses such a file: a result for the repository is
  made from paths in it.
* ``commit``: ``git rev-parse HEAD``; ``dirty``: whether a tracked file differs from it (``benchmarks/results``
  aside: the files runs write). Untracked files are not counted: they are outputs, and code that imports one
  differs from HEAD in a tracked file.
* ``started``: when the run started, UTC, ISO 8601 (to the millisecond); ``machine``: CPUs, platform, Python,
  ``OMP_NUM_THREADS``; ``load_start`` / ``load_end``: the 1, 5 and 15 minute load averages at the start and the end
  (on a shared machine the load says how far the figures can be trusted); ``wall_s``: the run's wall clock, from
  ``started``.
"""

import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

#: Where runs write their result files: not code, so a changed one does not make a run dirty.
RESULTS = "benchmarks/results"


class NotACheckoutError(RuntimeError):
    """The repository a run names is not a git checkout, so its result cannot name the commit it measured."""


@dataclass(frozen=True)
class RunStart:
    """A run's record as it started; :func:`finish` completes it for the result file."""

    command: str
    #: None outside a git checkout (:func:`start_anywhere`).
    commit: str | None
    dirty: bool | None
    started: str
    machine: dict[str, Any]
    load_start: tuple[float, float, float]


def git(repo: Path, *args: str) -> str:
    """``git -C repo ARGS``'s output; raises :class:`NotACheckoutError` when git fails."""
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise NotACheckoutError(
            f"`git {' '.join(args)}` failed in {repo}: {done.stderr.strip()}. A result file names "
            f"the commit it was measured on: run from a git clone of the repository."
        )
    return done.stdout.strip()


def relative_command(repo: Path, argv: Sequence[str], executable: str) -> str:
    """``executable argv...`` as a shell line, with absolute paths inside ``repo`` made relative to it (also the
    value of ``--flag=/path``); the executable by its name unless it lies in ``repo``."""

    def relative(arg: str) -> str:
        flag, equals, value = arg.partition("=") if arg.startswith("-") and "=" in arg else ("", "", arg)
        path = Path(os.path.normpath(value)) if os.path.isabs(value) else None
        if path is not None and path.is_relative_to(repo):
            value = path.relative_to(repo).as_posix()
        return flag + equals + value

    inside = Path(executable).is_absolute() and Path(executable).is_relative_to(repo)
    return shlex.join([relative(executable) if inside else Path(executable).name, *map(relative, argv)])


def checkout_of(path: Path) -> Path | None:
    """The root of the git checkout that holds ``path``, or None when it is in none (or git is missing)."""
    try:
        done = subprocess.run(["git", "-C", str(path), "rev-parse", "--show-toplevel"], capture_output=True, text=True)
    except FileNotFoundError:  # no git on this machine: no checkout to name
        return None
    return Path(done.stdout.strip()) if done.returncode == 0 else None


def start_anywhere(path: Path, argv: Sequence[str] | None = None, executable: str = sys.executable) -> RunStart:
    """:func:`start` for the checkout that holds ``path``; outside any checkout, a record without a commit
    (``commit`` and ``dirty`` None) whose command keeps its paths as given (``ep-trl train`` in a user's folder)."""
    repo = checkout_of(path)
    if repo is not None:
        return start(repo, argv, executable)
    return RunStart(
        command=shlex.join([Path(executable).name, *(sys.argv if argv is None else argv)]),
        commit=None,
        dirty=None,
        started=_now(),
        machine=_machine(),
        load_start=_load(),
    )


def start(repo: Path, argv: Sequence[str] | None = None, executable: str = sys.executable) -> RunStart:
    """The record of a run of code in ``repo`` (the checkout's root), as it starts. ``argv``: the script and its
    arguments (default ``sys.argv``); ``executable``: what ran it (default this interpreter)."""
    repo = Path(os.path.abspath(repo))
    commit = git(repo, "rev-parse", "HEAD")
    changed = git(repo, "status", "--porcelain", "--untracked-files=no", "--", ".", f":!{RESULTS}")
    return RunStart(
        command=relative_command(repo, sys.argv if argv is None else argv, executable),
        commit=commit,
        dirty=bool(changed),
        started=_now(),
        machine=_machine(),
        load_start=_load(),
    )


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def _machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
    }


def finish(record: RunStart) -> dict[str, Any]:
    """The run's record for the result file (JSON-ready): the start's, the load at the end and the wall clock."""
    return {
        "command": record.command,
        "commit": record.commit,
        "dirty": record.dirty,
        "started": record.started,
        "machine": record.machine,
        "load_start": list(record.load_start),
        "load_end": list(_load()),
        "wall_s": round((datetime.now(timezone.utc) - datetime.fromisoformat(record.started)).total_seconds(), 1),
    }


def _load() -> tuple[float, float, float]:
    one, five, fifteen = os.getloadavg()
    return round(one, 2), round(five, 2), round(fifteen, 2)
