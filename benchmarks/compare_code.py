"""Before/after: one benchmark script run on two versions of ep_trl in alternating rounds, every run kept.

    python benchmarks/compare_code.py --before 2caa10b --rounds 3 --out benchmarks/results/X.json -- \
        benchmarks/bridge_ceiling.py --arms openenv --concurrency 8 --turns 10 --logs off --repeats 3

The script is this checkout's (its flags, its measurement); only the ``ep_trl`` it imports changes: ``--before``'s
``src/`` (exported with ``git archive`` to a temporary directory) or ``--after``'s (default: this checkout's
``src/``), through ``PYTHONPATH``. Each round runs both, the order alternating (after then before, then before then
after, ...), so load from elsewhere hits both alike; ``--together`` runs the two of each round at the same time
instead, so both see the same load. Every run writes its own result file (the script's ``--out``); this driver
collects their rows (``runs``, ``batches`` or ``results``), each tagged with ``code`` (``before``/``after``) and
``round``, into ``--out`` with the command line, both commits and the machine's load. With ``--field F`` it prints
the median of ``F`` per code and configuration.
"""

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ep_trl.devtools import run_record  # noqa: E402

ROW_LISTS = ("runs", "batches", "results")
NOT_CONFIG = {"repeat", "round", "code", "batch"}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="the commit whose src/ is 'before'")
    parser.add_argument("--after", default=None, help="the commit whose src/ is 'after' (default: this checkout's)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--together", action="store_true", help="run before and after of a round at the same time")
    parser.add_argument("--field", default=None, help="a numeric row field to print medians of (e.g. cpu_ms_per_turn)")
    parser.add_argument("--note", default="", help="free text kept in the result file")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("script", nargs=argparse.REMAINDER, help="-- SCRIPT [ARGS...] (without --out)")
    args = parser.parse_args()
    args.script = [a for a in args.script if a != "--"] if args.script[:1] == ["--"] else args.script
    if not args.script:
        parser.error("name the benchmark script after --")
    return args


def export_src(rev: str, into: Path) -> Path:
    """``rev``'s ``src/`` under ``into``."""
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, "src"], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into / "src"


def commit_of(rev: str) -> str:
    return subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", rev], capture_output=True, text=True, check=True
    ).stdout.strip()


def start(script: list[str], src: Path, out: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), str(REPO)])}
    cmd = [sys.executable, *script, "--out", str(out)]
    print(f"[compare] PYTHONPATH={src} {shlex.join(cmd)}", flush=True)
    return subprocess.Popen(cmd, cwd=REPO, env=env)


def rows_of(result: dict[str, Any]) -> list[dict[str, Any]]:
    for key in ROW_LISTS:
        if isinstance(result.get(key), list):
            return result[key]
    raise ValueError(f"the script's result file has none of {ROW_LISTS}")


def main() -> None:
    args = parse_args()
    record = run_record.start(REPO)
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="ep-trl-compare-") as tmp:
        work = Path(tmp)
        codes = {
            "before": export_src(args.before, work / "before"),
            "after": export_src(args.after, work / "after") if args.after else REPO / "src",
        }
        for round_ in range(args.rounds):
            order = ("after", "before") if round_ % 2 == 0 else ("before", "after")
            outs = {code: work / f"{code}-{round_}.json" for code in order}
            if args.together:
                procs = [start(args.script, codes[code], outs[code]) for code in order]
                if any(p.wait() != 0 for p in procs):
                    raise SystemExit(f"a run of round {round_} failed")
            else:
                for code in order:
                    if start(args.script, codes[code], outs[code]).wait() != 0:
                        raise SystemExit(f"the {code} run of round {round_} failed")
            for code in order:
                runs += [{"code": code, "round": round_, **row} for row in rows_of(json.loads(outs[code].read_text()))]
    if args.field:
        configs = sorted(
            {
                tuple((k, v) for k, v in row.items() if k not in NOT_CONFIG and not isinstance(v, float))
                for row in runs
                if args.field in row
            },
            key=str,
        )
        for config in configs:
            mine = [r for r in runs if all(r.get(k) == v for k, v in config) and args.field in r]
            medians = {
                code: statistics.median(r[args.field] for r in mine if r["code"] == code)
                for code in ("before", "after")
                if any(r["code"] == code for r in mine)
            }
            print(dict(c for c in config if c[0] != "code"), {k: round(v, 3) for k, v in medians.items()})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "run": run_record.finish(record),
                "note": args.note,
                "script": args.script,
                "before": commit_of(args.before),
                "after": commit_of(args.after) if args.after else "this checkout",
                "together": args.together,
                "runs": runs,
            },
            indent=1,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
