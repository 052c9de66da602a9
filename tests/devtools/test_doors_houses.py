"""The doors game's held-out bookkeeping (``ep_trl.devtools.doors_houses``): the wordings a held-out set plays, the
no-gradient chance the real-model CI test is sized by, and the figures
docs/benchmarks.md quotes from the doors result files."""

import json
import re
from pathlib import Path
from typing import Any

import pytest

from ep_trl.devtools.doors_houses import PLAYED_WORDINGS, no_gradient_chance
from ep_trl.envs.doors import (
    COLOURS,
    HELD_OUT_WORDINGS,
    TRAINING_WORDINGS,
    DoorsAction,
    DoorsEnvironment,
    house,
    parse_door,
)

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
RESULT_FILES = ("smollm2_doors_seed0.json", "smollm2_doors_seed1.json", "smollm2_doors_seed0_rerun.json")


def test_a_held_out_set_plays_training_s_wordings_then_those_training_never_shows() -> None:
    assert PLAYED_WORDINGS == (*TRAINING_WORDINGS, *HELD_OUT_WORDINGS) and PLAYED_WORDINGS[:2] == ("is-open", "except")


def load(name: str) -> dict[str, Any]:
    return json.loads((RESULTS / name).read_text())


def test_the_base_model_s_step_one_success_and_the_ci_test_s_sizing() -> None:
    """From the three result files' step 1 (the base model, 16 episodes each, at the training temperature): 4 of 48
    episodes scored 1. The CI test's old sizing (2 steps of 2 groups of 6) trained nothing about one time in eight;
    its sizing now (2 steps of 6 groups of 8) about one time in 4,000."""
    step_one = [load(name)["steps_logged"][0] for name in RESULT_FILES]
    wins = sum(
        round(step["rewards/eval_score/mean"] * load(name)["episodes_per_step"])
        for step, name in zip(step_one, RESULT_FILES)
    )
    assert (wins, 16 * len(RESULT_FILES)) == (4, 48)
    p = wins / 48
    assert no_gradient_chance(p, group_size=6, groups_per_step=2, steps=2) == pytest.approx(0.124, abs=0.001)
    assert no_gradient_chance(p, group_size=8, groups_per_step=6, steps=2) == pytest.approx(2.4e-4, rel=0.02)
    assert no_gradient_chance(0.0695, group_size=8, groups_per_step=6, steps=2) == pytest.approx(0.001, rel=0.02)
    assert no_gradient_chance(0.5, 2, 1, 1) == 0.5 and no_gradient_chance(1.0, 4, 3, 2) == 1.0
    with pytest.raises(ValueError, match="need 0 <= success <= 1"):
        no_gradient_chance(1.5, 8, 2, 2)


def test_seed_0_had_no_gradient_on_13_of_its_20_steps() -> None:
    steps = load("smollm2_doors_seed0.json")["steps_logged"]
    assert len(steps) == 20 and sum(step["grad_norm"] == 0 for step in steps) == 13
    assert [sum(s["grad_norm"] == 0 for s in load(name)["steps_logged"]) for name in RESULT_FILES[1:]] == [10, 1]


def last_colour_player(seed: int) -> bool:
    """Leave house ``seed`` (training's wordings) naming the last colour word of each observation."""
    env = DoorsEnvironment()
    observation = env.reset(seed=seed)
    while not observation.done:
        colours = re.findall(r"\b(" + "|".join(COLOURS) + r")\b", observation.text)
        observation = env.step(DoorsAction(door=colours[-1]))
    return observation.escaped


def test_one_lexical_rule_leaves_every_held_out_house_of_the_result_files() -> None:
    """What docs/benchmarks.md says of the game as those runs played it: naming the last colour word of the latest
    message scores 1.000 on every held-out set, so the game did not need reading."""
    for name in RESULT_FILES:
        assert all(last_colour_player(seed) for seed in load(name)["held_out_houses"])


def first_replies(name: str) -> tuple[list[tuple[int, str, bool]], float]:
    """For each held-out episode before training, pairing rows with houses by order (these files do not record the
    house): (room, sign kind, whether the first reply in that room named its open door) for each room it reached;
    and how many rows the replay of their turns on the paired house scores as recorded."""
    result = load(name)
    firsts: list[tuple[int, str, bool]] = []
    matches = 0.0
    for seed, row in zip(result["held_out_houses"], result["held_out_before_episodes"]):
        env = DoorsEnvironment()
        observation = env.reset(seed=seed)
        rooms, reached = house(seed), set[int]()
        for turn in row["turns"]:
            room = rooms[observation.room - 1]
            if observation.room not in reached:
                reached.add(observation.room)
                firsts.append(
                    (
                        observation.room,
                        "except" if room.sign.startswith("Every") else "is-open",
                        parse_door(turn) == room.open_door,
                    )
                )
            observation = env.step(DoorsAction(door=parse_door(turn) or ""))
            if observation.done:
                break
        matches += float(observation.escaped) == row["score"]
    return firsts, matches


@pytest.mark.parametrize(
    ("name", "except_hits", "is_open_hits", "second_rooms", "replayed"),
    [
        ("smollm2_doors_seed0.json", (14, 16), (4, 16), (7, 20), 31),
        ("smollm2_doors_seed1.json", (15, 15), (4, 17), (1, 19), 32),
    ],
)
def test_the_base_model_named_the_open_door_under_one_wording_and_guessed_under_the_other(
    name: str, except_hits: tuple[int, int], is_open_hits: tuple[int, int], second_rooms: tuple[int, int], replayed: int
) -> None:
    """What docs/benchmarks.md and the README say of the base model's first replies (rows paired with houses by
    order)."""
    firsts, matches = first_replies(name)
    assert matches == replayed
    for kind, hits in (("except", except_hits), ("is-open", is_open_hits)):
        assert (
            sum(hit for r, k, hit in firsts if r == 1 and k == kind),
            sum(r == 1 and k == kind for r, k, _ in firsts),
        ) == hits
    assert (sum(hit for r, _, hit in firsts if r == 2), sum(r == 2 for r, _, _ in firsts)) == second_rooms
