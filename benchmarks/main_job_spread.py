"""The spread of the main job's learning test (issue 48, item 1): the README's quick start shortened to 10 steps, as
``tests/project/test_train_browsergym_script.py::test_the_main_job_learns_the_eval_and_plots_it`` runs it, repeated N
times on this machine. Each run's policy probability of the right first action (teacher-forced, which the script prints
before and after training) is read from its output; the weights come from sampled episodes that no seed fixes, so
runs differ. The test's threshold is set well below the lowest value measured here.

    python benchmarks/main_job_spread.py --runs 10 --out benchmarks/results/main_job_spread.json
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "src"), str(REPO)]

from ep_trl.devtools import run_record  # noqa: E402
from tests.project.test_train_browsergym_script import RIGHT, SCRIPT, first_turn_answers  # noqa: E402  (what the test reads)


def one_run(steps: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="main-job-") as folder:
        started = time.monotonic()
        proc = subprocess.run(
            [sys.executable, str(SCRIPT), "--max-steps", str(steps), "--output-dir", folder],
            cwd=folder,
            capture_output=True,
            text=True,
            timeout=1800,
        )
        seconds = time.monotonic() - started
    if proc.returncode != 0:
        raise RuntimeError(f"the main job exited {proc.returncode}: {proc.stderr[-2000:]}")
    before, after = (
        first_turn_answers(proc.stdout, "before training"),
        first_turn_answers(proc.stdout, "after training"),
    )
    return {
        "seconds": round(seconds, 1),
        "before": {task: before[task][answer] for task, answer in RIGHT.items()},
        "after": {task: after[task][answer] for task, answer in RIGHT.items()},
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--steps", type=int, default=10, help="the test's 10 steps")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    record = run_record.start(REPO, [__file__, *(sys.argv[1:] if argv is None else argv)])
    runs = []
    for k in range(args.runs):
        runs.append(one_run(args.steps))
        print(f"run {k + 1}/{args.runs}: {runs[-1]}", flush=True)
    lowest = [min(run["after"].values()) for run in runs]  # type: ignore[union-attr]
    result = {
        "run": run_record.finish(record),
        "steps": args.steps,
        "runs": runs,
        "after_right_probability_lowest_task": {
            "min": min(lowest),
            "median": statistics.median(lowest),
            "max": max(lowest),
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["after_right_probability_lowest_task"]))


if __name__ == "__main__":
    main()
