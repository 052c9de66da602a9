"""A pytest selection run N times in a row under a CPU load (issue 48: tests that cannot flake on correct code pass
20 times in a row under a load of twice the cores). The load is ``--load`` processes that spin on the CPU for as long
as the runs last (2 x the cores by default). Every run's outcome, pass counts and seconds are recorded; the runs go
on after a failure, so the record says how many of N passed.

    python benchmarks/repeat_tests.py --runs 20 --out benchmarks/results/shutdown_repeated.json -- \\
        tests/runtime/test_shutdown.py -k "not every_time and not sigkilled"

With ``--durations N`` each run also records pytest's N slowest test phases (``--durations=N``); one quiet run of the
whole suite publishes its time and slowest tests (issue 48, docs/benchmarks.md):

    python benchmarks/repeat_tests.py --runs 1 --load 0 --durations 30 --out benchmarks/results/suite_durations.json \\
        -- tests
"""

import argparse
import json
import multiprocessing
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from ep_trl.devtools import run_record  # noqa: E402


def _spin(stop: "multiprocessing.synchronize.Event") -> None:
    while not stop.is_set():
        sum(range(10_000))


def slowest(stdout: str) -> list[dict[str, object]]:
    """pytest's ``--durations`` block: each phase's seconds, phase (setup, call, teardown) and test id, slowest
    first."""
    block = stdout.split("slowest ", 1)[1] if "slowest " in stdout else ""
    return [
        {"seconds": float(s), "phase": phase, "test": test}
        for s, phase, test in re.findall(r"^([0-9.]+)s (setup|call|teardown) +(\S+)$", block, flags=re.M)
    ]


def failures_section(stdout: str, limit: int = 12_000) -> str:
    """pytest's report of what failed (its FAILURES and ERRORS sections, up to the short summary), at most ``limit``
    characters from each end."""
    starts = [at for at in (stdout.find("= ERRORS ="), stdout.find("= FAILURES =")) if at >= 0]
    section = stdout[min(starts) :] if starts else stdout
    section = section.split("short test summary info", 1)[0]
    return section if len(section) <= 2 * limit else section[:limit] + "\n[...]\n" + section[-limit:]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--load", type=int, default=2 * (os.cpu_count() or 1), help="spinning processes")
    parser.add_argument("--durations", type=int, default=0, help="record each run's N slowest test phases")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("pytest_args", nargs="+", help="after --: what pytest runs")
    args = parser.parse_args(argv)
    record = run_record.start(REPO, [__file__, *(sys.argv[1:] if argv is None else argv)])
    stop = multiprocessing.Event()
    spinners = [multiprocessing.Process(target=_spin, args=(stop,), daemon=True) for _ in range(args.load)]
    for spinner in spinners:
        spinner.start()
    runs = []
    try:
        for k in range(args.runs):
            started = time.monotonic()
            durations = [f"--durations={args.durations}"] if args.durations else []
            proc = subprocess.run(
                [sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider", *durations, *args.pytest_args],
                cwd=REPO,
                capture_output=True,
                text=True,
            )
            # pytest's own last line (a plugin may print after it)
            summary = next(
                (
                    line.strip("= ")
                    for line in reversed(proc.stdout.splitlines())
                    if re.search(r"\d+ (passed|failed|error)", line)
                ),
                "",
            )
            counts = {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|error|errors|skipped)", summary)}
            runs.append(
                {
                    "returncode": proc.returncode,
                    "seconds": round(time.monotonic() - started, 1),
                    "summary": summary,
                    "failed_tests": re.findall(r"^(?:FAILED|ERROR) (\S+)", proc.stdout, flags=re.M),
                    # a failed run keeps pytest's reasons and the end of its report, to read what went wrong
                    **(
                        {
                            "reasons": re.findall(r"^(?:FAILED|ERROR) \S+ - (.*)$", proc.stdout, flags=re.M),
                            "report": failures_section(proc.stdout),
                        }
                        if proc.returncode
                        else {}
                    ),
                    **counts,
                    **({"slowest": slowest(proc.stdout)} if args.durations else {}),
                }
            )
            print(f"run {k + 1}/{args.runs}: {summary}", *runs[-1]["failed_tests"], flush=True)
            if proc.returncode:
                print(runs[-1]["report"], flush=True)
    finally:
        stop.set()
        for spinner in spinners:
            spinner.join()
    passed = sum(run["returncode"] == 0 for run in runs)
    result = {
        "run": run_record.finish(record),
        "load_processes": args.load,
        "pytest_args": args.pytest_args,
        "runs": runs,
        "runs_passed": passed,
        "runs_total": len(runs),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{passed} of {len(runs)} runs passed")


if __name__ == "__main__":
    main()
