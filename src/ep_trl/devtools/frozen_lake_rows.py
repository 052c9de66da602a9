"""Rows for eval-protocol's FrozenLake benchmark (``eval_protocol.benchmarks.test_frozen_lake``), one lake per row.

The benchmark reads its rows from a JSONL file (``input_dataset``) through its own ``dataset_adapter``: each line has an
``id``, a ``system_prompt``, a ``user_prompt_template`` (``{observation}`` is the grid its MCP server renders) and an
``environment_context`` whose ``seed`` draws the 4x4 lake (gymnasium's ``generate_random_map``). eval-protocol keeps
three such rows in its repository, not in its package; this module writes any number of them, in the same format,
with this project's own wording, so that ``ep-trl train ... --input-dataset FILE`` can train on many lakes and hold
some out. The wording says what the benchmark's rules are and nothing more: which moves reach the goal is for the
model to read from the grid.

    python -m ep_trl.devtools.frozen_lake_rows --rows 1024 --first-seed 0 --out lakes.jsonl
"""

import argparse
import ast
import json
import re
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

SYSTEM_PROMPT = (
    "You play FrozenLake on a 4x4 grid of tiles: S is the start, F is safe ice, H is a hole and G is the "
    "goal. The ice is not slippery: each move goes where you say. Falling into a hole ends the game. "
    "Call the lake_move tool once per turn with one action: LEFT, DOWN, RIGHT or UP."
)
USER_PROMPT_TEMPLATE = (
    "The lake now:\n{observation}\n\nPick your next move (LEFT, DOWN, RIGHT or UP) and call lake_move."
)


def rows(count: int, first_seed: int = 0) -> Iterator[dict[str, object]]:
    """``count`` rows, lake seeds ``first_seed`` .. ``first_seed + count - 1``, ids ``lake-<seed>``."""
    for seed in range(first_seed, first_seed + count):
        yield {
            "id": f"lake-{seed}",
            "system_prompt": SYSTEM_PROMPT,
            "user_prompt_template": USER_PROMPT_TEMPLATE,
            "environment_context": {"game": "FrozenLake", "map_name": "4x4", "seed": seed},
        }


#: The moves, as the benchmark's tool takes them, and where each goes (row, column).
MOVES = {"LEFT": (0, -1), "DOWN": (1, 0), "RIGHT": (0, 1), "UP": (-1, 0)}
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def seeded_lake(seed: int) -> list[str]:
    """The 4x4 lake eval-protocol's FrozenLake adapter draws for ``seed``: gymnasium's ``generate_random_map(size=4,
    p=0.8, seed=seed)``, its rows of S, F, H, G."""
    from gymnasium.envs.toy_text.frozen_lake import generate_random_map

    return list(generate_random_map(size=4, p=0.8, seed=seed))


def lake_in(messages: Sequence[Mapping[str, object]]) -> tuple[list[str], int]:
    """The latest lake the messages show (its rows of S, F, H, G) and the player's position: the MCP server's
    observation, a JSON object in a tool result or its Python form in the first user message (``{observation}``).
    ValueError when no message shows one."""
    for message in reversed(messages):
        content = message.get("content")
        if not isinstance(content, str) or "grid" not in content:
            continue
        found = re.search(r"\{.*\}", content, flags=re.S)
        if found is None:
            continue
        try:
            observation = json.loads(found.group(0))
        except json.JSONDecodeError:
            observation = ast.literal_eval(found.group(0))
        grid = _ANSI.sub("", str(observation["grid"]))
        rows = [line for line in grid.splitlines() if line and set(line) <= set("SFHG")]
        return rows, int(observation["position"])
    raise ValueError("no message shows the lake (a grid and a position)")


def shortest_path_move(messages: Sequence[Mapping[str, object]]) -> str:
    """The first move of a shortest path from the player's position to the goal that avoids the holes, on the lake
    the messages show last: a scripted expert for ``python -m ep_trl.devtools.record_demonstrations --player``."""
    rows, position = lake_in(messages)
    return first_move(rows, position)


def first_move(rows: Sequence[str], position: int) -> str:
    """The first move of a shortest path from ``position`` to the goal on the lake ``rows`` that avoids the holes
    (breadth-first, moves tried in ``MOVES`` order); on the goal, a move into the lake's edge."""
    size = len(rows)
    start = divmod(position, size)
    queue: deque[tuple[tuple[int, int], str | None]] = deque([(start, None)])
    seen = {start}
    while queue:
        (r, c), first = queue.popleft()
        if rows[r][c] == "G":
            return first or _in_place(start, size)
        for move, (dr, dc) in MOVES.items():
            nr, nc = r + dr, c + dc
            if 0 <= nr < size and 0 <= nc < size and (nr, nc) not in seen and rows[nr][nc] != "H":
                seen.add((nr, nc))
                queue.append(((nr, nc), first or move))
    raise ValueError(f"no safe path to the goal on {list(rows)} from {position}")


def _in_place(position: tuple[int, int], size: int) -> str:
    """On the goal (the episode has ended; the benchmark's processor asks for one more turn): a move into the lake's
    edge, which leaves the player where it is."""
    r, c = position
    return next(move for move, (dr, dc) in MOVES.items() if not (0 <= r + dr < size and 0 <= c + dc < size))


def write(path: Path, count: int, first_seed: int = 0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows(count, first_seed)))
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1024, help="how many lakes (rows)")
    parser.add_argument("--first-seed", type=int, default=0, help="the first lake's seed")
    parser.add_argument("--out", type=Path, required=True, help="the JSONL file to write")
    args = parser.parse_args(argv)
    if args.rows < 1:
        parser.error(f"--rows {args.rows}: write one row or more")
    print(write(args.out, args.rows, args.first_seed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
