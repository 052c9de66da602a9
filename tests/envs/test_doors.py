"""The doors game: its rules in process, and a real server process played through its OpenEnv client."""

import asyncio
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from ep_trl.cli.env_server import local_env_server
from ep_trl.cli.heldout import SeedSplit
from ep_trl.devtools.doors_houses import SeedSource
from ep_trl.envs.doors import (
    COLOURS,
    HELD_OUT_WORDINGS,
    LOCKED_ONLY_WORDINGS,
    TRAINING_WORDINGS,
    WORDINGS,
    DoorsAction,
    DoorsEnv,
    DoorsEnvironment,
    house,
    parse_door,
)

if TYPE_CHECKING:
    from ep_trl.envs.doors.models import DoorsObservation

EVAL_DOORS = str(Path(__file__).resolve().parents[2] / "evals" / "eval_doors.py") + "::test_doors"


def wording_of(text: str) -> str:
    """Which wording a sign is in (the one whose template, its colours blanked, matches)."""
    blanked = re.sub(r"\b(" + "|".join(COLOURS) + r")\b", "C", text)
    blanked = re.sub(r"C(, C)* (and|or) C", "L", blanked)
    [name] = [
        w
        for w, t in WORDINGS.items()
        if blanked == t.replace("{open}", "C").replace("{locked}", "L").replace("{locked_or}", "L")
    ]
    return name


def test_a_house_is_drawn_from_its_seed_and_each_room_says_which_door_opens() -> None:
    assert house(7) == house(7) and house(7) != house(8)
    signs = set()
    for seed in range(200):
        for room in house(seed):
            assert len(set(room.doors)) == 4 and set(room.doors) <= set(COLOURS) and room.open_door in room.doors
            if "is open" in room.sign:
                assert room.sign == f"The {room.open_door} door is open; the others are locked."
            else:
                assert room.sign == f"Every door is locked except the {room.open_door} one."
            signs.add("is open" in room.sign)
    assert signs == {True, False}  # both kinds of sign occur


def test_a_locked_door_stays_shut_the_open_one_leads_on_and_the_moves_run_out() -> None:
    env = DoorsEnvironment()
    rooms = house(3)
    first = env.reset(seed=3)
    assert first.room == 1 and first.doors == list(rooms[0].doors) and rooms[0].sign in first.text
    locked = next(d for d in rooms[0].doors if d != rooms[0].open_door)
    missing = next(c for c in COLOURS if c not in rooms[0].doors)
    shut = env.step(DoorsAction(door=locked))
    assert shut.room == 1 and shut.reward == 0.0 and not shut.done
    assert shut.text.startswith(f"The {locked} door is locked.")
    assert env.step(DoorsAction(door=missing)).text.startswith(f"There is no {missing} door in this room.")
    assert env.step(DoorsAction(door="")).text.startswith("You did not name a door.")
    last = env.step(DoorsAction(door=rooms[0].open_door))  # the fourth move: through, but out of moves
    assert last.done and last.reward == 0.0 and not last.escaped and "out of moves" in last.text
    with pytest.raises(RuntimeError, match="is over"):
        env.step(DoorsAction(door="red"))


def test_a_player_that_reads_each_room_leaves_in_one_move_per_room() -> None:
    env = DoorsEnvironment()
    env.reset(seed=11)
    for room in house(11):
        result = env.step(DoorsAction(door=room.open_door))
    assert result.done and result.escaped and result.reward == 1.0 and result.moves == 2


@pytest.mark.parametrize(
    ("text", "door"),
    [
        ("blue", "blue"),
        ("The Blue door.", "blue"),
        ("I take the red door, not the green one", "red"),
        ("bluey reddish", None),
        ("", None),
        ("Open the door on the left", None),
    ],
)
def test_the_door_a_reply_names_is_its_first_colour_word(text: str, door: str | None) -> None:
    assert parse_door(text) == door


def test_the_held_out_seeds_of_the_doors_preset_keep_their_houses_out_of_training() -> None:
    """``ep-trl train --held-out`` keeps seeds apart, not houses (``ep_trl.devtools.doors_houses``): two seeds draw
    the same doors and open doors with chance 1 / 45,158,400. On the doors preset's held-out sets (32 houses, seeds 0
    to 2), the held-out houses are distinct and no training group among the first 20,000 (a default run plays 40)
    draws one of them."""

    def doors(seed: int) -> tuple[tuple[tuple[str, ...], str], ...]:
        return tuple((room.doors, room.open_door) for room in house(seed))

    assert (8 * 7 * 6 * 5 * 4) ** 2 == 45_158_400
    for seed in range(3):
        split = SeedSplit.draw(seed, 32)
        held = {doors(s) for s in split.held_out}
        assert len(held) == 32
        assert not [g for g in range(20_000) if doors(split.training_seed(g)) in held]


def test_the_signs_old_houses_showed_are_unchanged_and_a_named_wording_changes_only_the_signs() -> None:
    """Old result files' houses stay the houses they played: seed 3 as it was drawn before wordings existed."""
    assert [(r.doors, r.open_door, r.sign) for r in house(3)] == [
        (("red", "green", "white", "black"), "black", "The black door is open; the others are locked."),
        (("white", "green", "blue", "orange"), "white", "Every door is locked except the white one."),
    ]
    for seed in range(50):
        for wording in WORDINGS:
            worded = house(seed, wording=wording)
            assert [(r.doors, r.open_door) for r in worded] == [(r.doors, r.open_door) for r in house(seed)]
            assert all(wording_of(r.sign) == wording for r in worded)
    with pytest.raises(ValueError, match="no sign wording 'tricky'; the wordings are is-open, except"):
        house(1, wording="tricky")


def test_a_locked_only_sign_names_every_locked_door_and_never_the_open_one() -> None:
    assert set(LOCKED_ONLY_WORDINGS) <= set(HELD_OUT_WORDINGS) and len(HELD_OUT_WORDINGS) >= 3
    assert set(TRAINING_WORDINGS).isdisjoint(HELD_OUT_WORDINGS)
    assert house(3, wording="locked")[0].sign == "The red, green and white doors are locked."
    for seed in range(200):
        for wording in LOCKED_ONLY_WORDINGS:
            for room in house(seed, wording=wording):
                named = set(re.findall(r"\b(" + "|".join(COLOURS) + r")\b", room.sign))
                assert room.open_door not in room.sign and named == set(room.doors) - {room.open_door}
        for wording in set(WORDINGS) - set(LOCKED_ONLY_WORDINGS):
            assert all(r.open_door in r.sign for r in house(seed, wording=wording))


def last_colour(text: str) -> str | None:
    """The lexical rule: the last colour word of a message."""
    words = re.findall(r"\b(" + "|".join(COLOURS) + r")\b", text)
    return words[-1] if words else None


def test_copying_the_last_colour_leaves_every_house_under_training_signs_but_not_under_locked_only_ones() -> None:
    """The game as it stood (training's two wordings) did not need reading: naming the last colour word of the
    latest message leaves every house. Under a sign that names only the locked doors it never leaves the first
    room."""

    def play(seed: int, wording: str | None) -> bool:
        env = DoorsEnvironment()
        observation = env.reset(seed=seed, wording=wording)
        while not observation.done:
            observation = env.step(DoorsAction(door=last_colour(observation.text) or ""))
        return observation.escaped

    split = SeedSplit.draw(0, 32)
    assert all(play(seed, None) for seed in range(500)) and all(
        play(seed, w) for seed in split.held_out for w in TRAINING_WORDINGS
    )
    assert not any(play(seed, w) for seed in split.held_out for w in LOCKED_ONLY_WORDINGS)


def test_training_resets_never_show_a_held_out_wording() -> None:
    """What training plays: resets with the training source name a seed only, so every room's sign is in a training
    wording; both occur."""
    env = DoorsEnvironment()
    seen = set()
    split = SeedSplit.draw(0, 8)
    for seed in (split.training_seed(group) for group in range(300)):
        assert isinstance(seed, int)
        observation = env.reset(seed=seed)
        assert observation.wording is None and observation.metadata == {"seed": seed, "wording": None}
        for room in house(seed):
            seen.add(wording_of(room.sign))
        sign = re.search(r"Doors: [a-z, ]+\. (.+\.) Moves left", observation.text)
        assert sign is not None
        seen.add(wording_of(sign.group(1)))
    assert seen == set(TRAINING_WORDINGS)


def test_the_served_game_plays_the_house_its_client_hands_out() -> None:
    """A real server process (``python -m ep_trl.envs.doors``, openenv's stock app) through the async client: a
    reset that names no seed plays the house the ``seeds`` source gives, a locked door is answered, and reading
    each room leaves the house."""
    seeds = iter([21, 22])

    async def play(url: str) -> list[tuple[bool, float | None, bool]]:
        async with DoorsEnv(base_url=url, seeds=lambda: next(seeds)) as env:
            outcomes = []
            for seed in (21, 22):
                result = await env.reset(task_name="doors")  # a task name from a rotating loop is dropped
                assert result.observation.doors == list(house(seed)[0].doors)
                locked = next(d for d in house(seed)[0].doors if d != house(seed)[0].open_door)
                result = await env.step(DoorsAction(door=locked))
                assert not result.done and f"The {locked} door is locked." in result.observation.text
                for room in house(seed):
                    result = await env.step(DoorsAction(door=room.open_door))
                outcomes.append((result.done, result.reward, result.observation.escaped))
            return outcomes

    with local_env_server("ep_trl.envs.doors") as url:
        assert asyncio.run(play(url)) == [(True, 1.0, True), (True, 1.0, True)]


def test_the_served_game_plays_the_wording_its_client_hands_out_and_reports_the_house() -> None:
    """A ``(seed, wording)`` from the source puts every sign of that house in that wording, and each observation's
    ``metadata`` (put back by the client: openenv's server leaves it off the wire) says which house and wording."""

    async def play(url: str) -> "tuple[DoorsObservation, DoorsObservation, DoorsObservation]":
        plays: list[int | tuple[int, str | None]] = [(31, "locked"), 32]
        async with DoorsEnv(base_url=url, seeds=SeedSource(iter(plays))) as env:
            first = (await env.reset()).observation
            step = (await env.step(DoorsAction(door=house(31)[0].open_door))).observation
            second = (await env.reset()).observation
            return first, step, second

    with local_env_server("ep_trl.envs.doors") as url:
        first, step, second = asyncio.run(play(url))
    assert first.metadata == step.metadata == {"seed": 31, "wording": "locked"}
    assert house(31, wording="locked")[0].sign in first.text and house(31)[0].open_door not in first.text.split(". ")[2]
    assert house(31, wording="locked")[1].sign in step.text
    assert second.metadata == {"seed": 32, "wording": None} and house(32)[0].sign in second.text


@pytest.mark.timeout(300)
def test_each_episode_s_row_records_the_house_and_wording_it_played(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Through the doors eval and ep_trl's loop (a tiny model on the trainer backend, its replies random): the
    rollout output's ``instance`` and each episode's ``ep logs`` row say which house and wording that episode
    played, and its first prompt shows that house's sign in that wording (the pairing, not only the set)."""
    from ep_trl import EvalOverrides, RolloutOptions, create_rollout_func, dataset_from_eval
    from ep_trl.evalprotocol.store import StoreLogger
    from tests.support.trainers import make_trainer

    plays = [(41, "locked"), (42, "only"), (43, None), (44, "do-not-try")]
    with local_env_server("ep_trl.envs.doors") as url:
        source = SeedSource(iter(plays))
        rollout = create_rollout_func(
            EVAL_DOORS,
            backend="trainer",
            options=RolloutOptions(log_home=str(tmp_path / "logs")),
            overrides=EvalOverrides(env_factory=lambda: DoorsEnv(base_url=url, seeds=source).sync()),
        )
        prompt = dataset_from_eval(EVAL_DOORS)["prompt"][0]
        trainer = make_trainer(tiny_model_dir, tmp_path / "out", rollout, max_completion_length=96)
        try:
            out = rollout([prompt] * 4, trainer)
        finally:
            rollout.close()
    assert out["episode_status"] == ["finished"] * 4
    assert sorted(out["instance"], key=lambda i: i["seed"]) == [{"seed": s, "wording": w} for s, w in plays]
    store = StoreLogger(tmp_path / "logs" / ".eval_protocol" / "logs.db")
    for instance, rollout_id in zip(out["instance"], out["rollout_id"]):
        row = store.read(rollout_id)[-1]
        assert row.execution_metadata.extra["ep_trl"]["instance"] == instance
        first_user = next(m.content for m in row.messages if m.role == "user")
        assert house(instance["seed"], wording=instance["wording"])[0].sign in first_user


class _ScriptedPlayer:
    """A scripted player, not a model: it answers each turn from the room's text (the open door, or a locked one when
    ``reads`` is False), through eval-protocol's policy hook, so the eval's own wiring can be checked end to end."""

    def __init__(self, reads: bool) -> None:
        self.reads = reads

    async def _make_llm_call(self, messages: list[dict[str, Any]], tools: object) -> dict[str, Any]:
        import re

        text = messages[-1]["content"]
        listed = re.search(r"Doors: ([a-z, ]+)\.", text)
        named = re.search(r"The (\w+) door is open|except the (\w+) one", text)
        assert listed is not None and named is not None
        doors = listed.group(1).split(", ")
        open_door = named.group(1) or named.group(2)
        answer = f"The {open_door} door." if self.reads else next(d for d in doors if d != open_door)
        return {
            "choices": [{"message": {"role": "assistant", "content": answer}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }


@pytest.mark.parametrize(("reads", "score", "moves"), [(True, 1.0, 2), (False, 0.0, 4)])
def test_the_doors_eval_runs_under_eval_protocols_own_processor(
    monkeypatch: pytest.MonkeyPatch, reads: bool, score: float, moves: int
) -> None:
    """``evals/eval_doors.py`` as eval-protocol runs it: its ``OpenEnvRolloutProcessor`` (env_factory,
    prompt builder, action parser) against a real server, then its body."""
    import copy
    import importlib.util
    from pathlib import Path

    from eval_protocol.models import EvaluationRow
    from eval_protocol.pytest.types import RolloutProcessorConfig

    path = Path(__file__).resolve().parents[2] / "evals" / "eval_doors.py"
    spec = importlib.util.spec_from_file_location("eval_doors_under_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    params = module.test_doors.__ep_params__
    processor = copy.copy(params.rollout_processor)
    processor.policy_factory = lambda *args, **kwargs: _ScriptedPlayer(reads)
    with local_env_server("ep_trl.envs.doors") as url:
        monkeypatch.setenv(module.ENV_URL_VAR, url)
        config = RolloutProcessorConfig(
            completion_params=dict(params.completion_params[0]),
            mcp_config_path="",
            semaphore=asyncio.Semaphore(1),
            steps=params.steps,
        )
        [row] = [EvaluationRow(messages=[m.model_copy() for m in msgs]) for msgs in params.input_messages[0]]

        async def go() -> list[Any]:
            return await asyncio.gather(*processor([row], config))

        [played] = asyncio.run(go())
    users = [m.content for m in played.messages if m.role == "user"]
    assert users[0].startswith("Room 1 of 2. Doors: ") and users[0].endswith(
        "Which door do you take? Answer with the door's color."
    )
    assert len(played.execution_metadata.extra["step_rewards"]) == moves
    assert module.test_doors._origin_func(played).evaluation_result.score == score
