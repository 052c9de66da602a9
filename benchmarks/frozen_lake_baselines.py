#!/usr/bin/env python
"""What eval-protocol's FrozenLake benchmark scores without reading the grid, on the lakes a run holds out.

The benchmark (``eval_protocol.benchmarks.test_frozen_lake``) draws a 4x4 lake from each row's seed (gymnasium's
``generate_random_map(size=4, p=0.8, seed=...)``, not slippery) and scores 1 when the player reaches the goal. A
trained policy's gain means reading only where it beats the policies that never look at the grid. This plays them on
the same lakes, with gymnasium's own environment (what the benchmark's MCP server steps), for each move cap:

* a fixed reply: the same action every turn (LEFT, DOWN, RIGHT, UP): the issue's "no fixed reply" check;
* uniform random moves (what a warm start on random demonstrations imitates), and random among RIGHT and DOWN only;
* RIGHT and DOWN alternating (either first);
* the shortest safe path (breadth-first search on the lake): the ceiling.

With ``--sequence MOVES`` (e.g. ``RIGHT,DOWN,RIGHT,DOWN,RIGHT,RIGHT,DOWN,RIGHT``, repeatable) a fixed sequence of moves
is played too, the same on every lake, its last move repeated: what a policy that plays one route whatever the lake
scores. With ``--lakes-of RESULT.json`` the lakes are the held-out rows of an ``ep-trl train`` run (row ids
``lake-<seed>``) instead of ``--first-seed`` and ``--lakes``.

Random policies are averaged over ``--draws`` seeded draws per lake. Move caps: the eval's own steps (30,
eval-protocol's default for an eval that names none) and the moves that fit a run's token budget (``--caps``).

    python benchmarks/frozen_lake_baselines.py --first-seed 0 --lakes 1024 --out
    benchmarks/results/frozen_lake_baselines.json
"""

import argparse
import json
import random
import sys
from collections import deque
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "src"))

from ep_trl.devtools import run_record  # noqa: E402
from ep_trl.devtools.frozen_lake_rows import first_move, seeded_lake  # noqa: E402

LEFT, DOWN, RIGHT, UP = 0, 1, 2, 3
NAMES = ("LEFT", "DOWN", "RIGHT", "UP")
MOVES = {LEFT: (0, -1), DOWN: (1, 0), RIGHT: (0, 1), UP: (-1, 0)}

Policy = Callable[[random.Random, int, list[str], int], int]


def shortest_path(desc: list[str]) -> list[int]:
    """The moves of a shortest path from S to G that avoids holes (generate_random_map guarantees one)."""
    n = len(desc)
    start = next((r, c) for r in range(n) for c in range(n) if desc[r][c] == "S")
    queue: deque[tuple[tuple[int, int], list[int]]] = deque([(start, [])])
    seen = {start}
    while queue:
        (r, c), path = queue.popleft()
        if desc[r][c] == "G":
            return path
        for action, (dr, dc) in MOVES.items():
            nr, nc = r + dr, c + dc
            if 0 <= nr < n and 0 <= nc < n and (nr, nc) not in seen and desc[nr][nc] != "H":
                seen.add((nr, nc))
                queue.append(((nr, nc), [*path, action]))
    raise ValueError(f"no path on lake {desc}")


def play(desc: list[str], policy: Policy, cap: int, rng: random.Random) -> float:
    from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv

    env = FrozenLakeEnv(desc=desc, is_slippery=False)
    state, _ = env.reset(seed=0)
    for turn in range(cap):
        state, reward, terminated, _, _ = env.step(policy(rng, turn, desc, state))
        if terminated:
            return float(reward)
    return 0.0


def sequence_policy(moves: list[int]) -> Policy:
    """The same ``moves`` on every lake, turn by turn, the last one repeated."""
    return lambda rng, turn, desc, state: moves[min(turn, len(moves) - 1)]


def held_out_seeds(path: Path) -> list[int]:
    """The lake seeds of a run's held-out rows (``held_out_before_rows``, row ids ``lake-<seed>``)."""
    rows = json.loads(path.read_text())["held_out_before_rows"]
    return [int(str(row["row_id"]).removeprefix("lake-")) for row in rows]


def policies() -> dict[str, tuple[Policy, bool]]:
    """name -> (policy, random?)."""
    fixed: dict[str, tuple[Policy, bool]] = {
        f"fixed {NAMES[a]}": ((lambda a: lambda rng, turn, desc, state: a)(a), False) for a in range(4)
    }
    return {
        **fixed,
        "uniform random": (lambda rng, turn, desc, state: rng.randrange(4), True),
        "random RIGHT/DOWN": (lambda rng, turn, desc, state: rng.choice((RIGHT, DOWN)), True),
        "alternate RIGHT, DOWN": (lambda rng, turn, desc, state: (RIGHT, DOWN)[turn % 2], False),
        "alternate DOWN, RIGHT": (lambda rng, turn, desc, state: (DOWN, RIGHT)[turn % 2], False),
        "shortest path (reads the grid)": (lambda rng, turn, desc, state: _next_on_path(desc, state), False),
    }


def _next_on_path(desc: list[str], state: int) -> int:
    """The shortest safe path's next move from ``state``: the scripted expert's (``frozen_lake_rows.first_move``)."""
    return NAMES.index(first_move(desc, state))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--lakes", type=int, default=1024)
    parser.add_argument("--caps", default="6,8,10,30", help="move caps, comma-separated")
    parser.add_argument("--draws", type=int, default=8, help="draws per lake of each random policy")
    parser.add_argument(
        "--sequence",
        action="append",
        default=[],
        metavar="MOVES",
        help="a fixed sequence of moves, comma-separated (LEFT, DOWN, RIGHT, UP), played on every lake",
    )
    parser.add_argument(
        "--lakes-of",
        type=Path,
        default=None,
        metavar="RESULT",
        help="play the held-out lakes of this ep-trl train result.json instead",
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    chosen = policies()
    for text in args.sequence:
        moves = [m.strip().upper() for m in text.split(",")]
        if not moves or any(m not in NAMES for m in moves):
            parser.error(f"--sequence {text}: give moves from {', '.join(NAMES)}, comma-separated")
        chosen[f"sequence {','.join(moves)}"] = (sequence_policy([NAMES.index(m) for m in moves]), False)
    record = run_record.start(REPO, [__file__, *(sys.argv[1:] if argv is None else argv)])
    seeds = (
        held_out_seeds(args.lakes_of)
        if args.lakes_of is not None
        else list(range(args.first_seed, args.first_seed + args.lakes))
    )
    lakes = [seeded_lake(seed) for seed in seeds]
    caps = [int(c) for c in args.caps.split(",")]
    table: list[dict[str, object]] = []
    for name, (policy, is_random) in chosen.items():
        draws = args.draws if is_random else 1
        line = []
        for cap in caps:
            rng = random.Random(f"{name} {cap}")
            wins = sum(play(desc, policy, cap, rng) for desc in lakes for _ in range(draws))
            table.append({"policy": name, "max_moves": cap, "success": round(wins / (len(lakes) * draws), 4)})
            line.append(f"cap {cap}: {wins / (len(lakes) * draws):.3f}")
        print(f"{name:32s} " + "  ".join(line), flush=True)
    path_lengths = [len(shortest_path(desc)) for desc in lakes]
    result = {
        "run": run_record.finish(record),
        "seeds": seeds,
        "lakes": len(lakes),
        "draws": args.draws,
        "table": table,
        "shortest_path_moves": {str(k): path_lengths.count(k) for k in sorted(set(path_lengths))},
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
