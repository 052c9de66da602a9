#!/usr/bin/env python
"""Which door a doors run's first replies name, per sign wording, before and after training.

Reads the held-out rows of a doors result file (``recipes/doors/smollm2.py --result FILE``): each row records the house
(``instance.seed``) and the sign wording it played. The house's first room is rebuilt with the game's own
``ep_trl.envs.doors.house``, and the first colour word of the row's first reply (the eval's parser reads the first
colour) is compared with the room: the open door, a door the sign names, or neither. A policy that reads the room names
the open door under every wording; one that copies the sign's colour names a door the sign names, which under the
wordings that name only locked doors is a locked one.

    python benchmarks/doors_first_replies.py --result benchmarks/results/smollm2_doors_seed0_wordings.json --out
    benchmarks/results/smollm2_doors_seed0_first_replies.json
"""

import argparse
import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "src"))

from ep_trl.devtools import run_record  # noqa: E402
from ep_trl.envs.doors.environment import COLOURS, house  # noqa: E402

FIRST_COLOUR = re.compile(r"\b(" + "|".join(COLOURS) + r")\b", re.IGNORECASE)


def first_reply_counts(rows: list[dict[str, object]]) -> dict[str, dict[str, int]]:
    """Per wording: episodes, first replies naming the open door, and first replies naming a door the sign names."""
    counts: dict[str, dict[str, int]] = {}
    for row in rows:
        instance = row["instance"]
        assert isinstance(instance, dict), row
        wording = str(instance["wording"])
        room = house(int(instance["seed"]), wording=wording)[0]
        turns = row["turns"]
        assert isinstance(turns, list)
        found = FIRST_COLOUR.search(str(turns[0])) if turns else None
        colour = found.group(1).lower() if found else None
        named = {door for door in room.doors if re.search(rf"\b{door}\b", room.sign)}
        seen = counts.setdefault(wording, {"episodes": 0, "open_door": 0, "sign_named": 0})
        seen["episodes"] += 1
        seen["open_door"] += colour == room.open_door
        seen["sign_named"] += colour in named
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--result", type=Path, required=True, help="a doors run's result file")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    record = run_record.start(REPO, [__file__, *(sys.argv[1:] if argv is None else argv)])
    result = json.loads(args.result.read_text())
    table = []
    for side in ("before", "after"):
        for wording, seen in first_reply_counts(result[f"held_out_{side}_rows"]).items():
            table.append({"side": side, "wording": wording, **seen})
            print(
                f"{side:6s} {wording:14s} open door {seen['open_door']}/{seen['episodes']}, "
                f"a door the sign names {seen['sign_named']}/{seen['episodes']}",
                flush=True,
            )
    out = {"run": run_record.finish(record), "result": str(args.result), "table": table}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
