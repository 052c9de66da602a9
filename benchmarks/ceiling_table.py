"""At what generation rate the bridge's own CPU becomes the limit, per path: computed from the result files of
``benchmarks/bridge_ceiling.py`` (generation free, the bridge process's CPU per turn and its worker-process scaling
measured there), nothing measured anew.

    python benchmarks/ceiling_table.py --results benchmarks/results/history --out FILE

``--results`` is the directory holding the ``bridge_ceiling.py`` result files it reads (``PATHS``); the files behind
docs/benchmarks.md's table were measured on code not in the repository and are in ``benchmarks/results/history/``.

Per path: the CPU ms one turn costs the trainer process (median of its run), the turns/s one process can carry
when it has a core to itself (1000 / that), the turns/s measured with free generation on this 2-core machine (where
the stand-in server and the environment or MCP server share the cores with it) with one and two worker processes,
and their ratio. A generation server (a GPU) that delivers more turns/s than a path's limit leaves the bridge as the
bottleneck there; ``RolloutOptions(worker_processes=N)`` on N free cores moves the limit by the measured ratio.
"""

import argparse
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ep_trl.devtools import run_record  # noqa: E402

#: path -> (result file of one process, its configuration, result file with 1 and 2 workers, its configuration)
PATHS: dict[str, tuple[str, dict[str, Any], str | None, dict[str, Any]]] = {
    "OpenEnv loop (letters, 10 turns, ep logs off; CPU at concurrency 64, workers at 8)": (
        "bridge_ceiling_openenv_floor.json",
        {"arm": "openenv", "turns": 10, "concurrency": 64, "logs": "off"},
        "bridge_ceiling_workers_idle_openenv.json",
        {"arm": "openenv", "turns": 10, "concurrency": 8, "logs": "off"},
    ),
    "OpenEnv loop (letters, 10 turns, ep logs on; CPU at concurrency 64, workers at 8)": (
        "bridge_ceiling_openenv_floor.json",
        {"arm": "openenv", "turns": 10, "concurrency": 64, "logs": "on"},
        "bridge_ceiling_workers_idle_openenv.json",
        {"arm": "openenv", "turns": 10, "concurrency": 8, "logs": "on"},
    ),
    "processor: SingleTurnRolloutProcessor (LiteLLM; concurrency 8)": (
        "bridge_ceiling_workers_idle.json",
        {"arm": "single_turn", "concurrency": 8, "workers": 1},
        "bridge_ceiling_workers_idle.json",
        {"arm": "single_turn", "concurrency": 8},
    ),
    "processor: SingleTurnRolloutProcessor (LiteLLM; concurrency 64)": (
        "bridge_ceiling_workers_idle.json",
        {"arm": "single_turn", "concurrency": 64, "workers": 1},
        "bridge_ceiling_workers_idle.json",
        {"arm": "single_turn", "concurrency": 64},
    ),
    "processor: a multi-turn LiteLLM processor (chat, 3 turns; concurrency 8)": (
        "bridge_ceiling_workers_idle.json",
        {"arm": "chat", "concurrency": 8, "workers": 1},
        "bridge_ceiling_workers_idle.json",
        {"arm": "chat", "concurrency": 8},
    ),
    "processor: AgentRolloutProcessor with an MCP tool (3 turns; concurrency 8)": (
        "bridge_ceiling.json",
        {"arm": "agent", "concurrency": 8, "logs": "off"},
        None,
        {},
    ),
}


def row(results: Path, file: str, where: dict[str, Any]) -> dict[str, Any]:
    rows = [
        r
        for r in json.loads((results / file).read_text())["summary"]
        if all(r.get(k, 1 if k == "workers" else None) == v for k, v in where.items())
    ]
    if len(rows) != 1:
        raise SystemExit(f"{file}: {len(rows)} summary rows match {where}, want 1")
    return rows[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--results",
        type=Path,
        default=REPO / "benchmarks" / "results",
        help="the directory of the bridge_ceiling.py result files it reads",
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    record = run_record.start(REPO)
    table = []
    for path, (file, where, scaling_file, scaling_where) in PATHS.items():
        one = row(args.results, file, where)
        entry = {
            "path": path,
            "source": file,
            "cpu_ms_per_turn": one["cpu_ms_per_turn"],
            "turns_per_s_one_core": 1000 / one["cpu_ms_per_turn"],
        }
        if scaling_file:
            w1 = row(args.results, scaling_file, {**scaling_where, "workers": 1})
            w2 = row(args.results, scaling_file, {**scaling_where, "workers": 2})
            entry.update(
                scaling_source=scaling_file,
                measured_turns_per_s_1_worker=w1["turns_per_s"],
                measured_turns_per_s_2_workers=w2["turns_per_s"],
                two_worker_ratio=w2["turns_per_s"] / w1["turns_per_s"],
            )
        table.append(entry)
    print("| path | CPU ms/turn | limit, one process on a core (turns/s) | measured, 1 worker | 2 workers | ratio |")
    print("|---|---|---|---|---|---|")
    for e in table:
        measured = (
            f"{e['measured_turns_per_s_1_worker']:.0f} | {e['measured_turns_per_s_2_workers']:.0f} | "
            f"{e['two_worker_ratio']:.2f}x"
            if "two_worker_ratio" in e
            else "- | - | -"
        )
        print(f"| {e['path']} | {e['cpu_ms_per_turn']:.2f} | {e['turns_per_s_one_core']:.0f} | {measured} |")
    if args.out:
        args.out.write_text(json.dumps({"run": run_record.finish(record), "table": table}, indent=1) + "\n")


if __name__ == "__main__":
    main()
