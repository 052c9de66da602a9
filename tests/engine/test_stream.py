"""``ep_trl.engine.stream.stream_groups`` driven directly, with a stand-in episode player and generator (the sources
and backends are tested in their own folders): episode slots, the order groups are released in, each scoring mode,
failed episodes, ``may_start``, and what the stream cancels when its consumer stops early or an error that is not an
episode's own raises.

The player is a fake (named as such): each episode waits on its own ``asyncio.Event`` (or a delay), so the test
decides when it ends, and returns a finished or failed episode whose row carries step rewards the letters evals'
real bodies score (``tests.evals.eval_letters``: pointwise, the mean of its step rewards;
``tests.evals.eval_letters_groupwise``: each row's sum over the best in its group)."""

import asyncio
import dataclasses
from typing import TYPE_CHECKING, Any, Literal, cast

import pytest

from ep_trl.engine.scoring import FAILED_EPISODE
from ep_trl.engine.stream import GroupPlan, SlotMeter, stream_groups
from ep_trl.evalprotocol import build_row, read_eval_spec, resolve_eval_test
from ep_trl.generation import Generator
from ep_trl.sources import EpisodeRequest
from ep_trl.trajectory.episode import Episode, EpisodePlan
from ep_trl.trajectory.tokens import Trajectory
from ep_trl.trajectory.types import Row

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterable, Iterator

    from ep_trl.engine.stream import ScoredGroup
    from ep_trl.evalprotocol import EvalSpec
    from ep_trl.traininglog.rows import RowContext

POINTWISE = "tests.evals.eval_letters"
GROUPWISE = "tests.evals.eval_letters_groupwise"


class FakeGenerator:
    """The stream reads only whether the backend failed for good."""

    name = "fake"
    max_model_len = None
    failure = None


class FakePlayer:
    """Plays episode ``(group, member)`` by waiting for its event (set by the test) or its delay, then returns
    a finished episode whose row has ``rewards[(group, member)]`` as step rewards, or a failed one for the keys in
    ``failing``. Records the order episodes started and ended, and the most in flight at once."""

    def __init__(
        self,
        rewards: dict[tuple[int, int], list[float]],
        *,
        delays: dict[tuple[int, int], float] | None = None,
        failing: "Iterable[tuple[int, int]]" = (),
        raising: tuple[int, int] | None = None,
    ) -> None:
        self.rewards, self.delays, self.failing, self.raising = rewards, delays or {}, set(failing), raising
        self.events = {key: asyncio.Event() for key in rewards}
        self.started: list[tuple[int, int]] = []
        self.ended: list[tuple[int, int]] = []
        self.cancelled: list[tuple[int, int]] = []
        self.in_flight = self.most_in_flight = 0

    @property
    def env_sessions(self) -> int:
        return 0

    async def play(self, request: EpisodeRequest, generator: Generator) -> tuple[Episode, Row]:
        key = (request.group, request.member)
        self.started.append(key)
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            if key in self.delays:
                await asyncio.sleep(self.delays[key])
            else:
                await self.events[key].wait()
            if key == self.raising:
                raise RuntimeError("not an episode's own error: ep_trl's bug")
        except asyncio.CancelledError:
            self.cancelled.append(key)
            raise
        finally:
            self.in_flight -= 1
        self.ended.append(key)
        failed = key in self.failing
        plan = EpisodePlan(
            index=request.index, group=request.group, member=request.member, task=None, initial_messages=()
        )
        episode = Episode(
            plan=plan,
            trajectory=Trajectory((1,), (2,), (-0.5,), (1,)),
            messages=(),
            step_rewards=tuple(self.rewards[key]),
            actions=(),
            status="error" if failed else "finished",
            stop_reason="error" if failed else "done",
            error="env died" if failed else None,
            error_kind="environment" if failed else None,
            duration_s=0.0,
            prompt_tokens=1,
        )
        row = build_row(
            messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "aeiou"}],
            eval_name="letters",
            row_id=f"row-{request.group}",
            rollout_id=request.rollout_id,
            invocation_id="i",
            experiment_id="e",
            run_id="s",
            completion_params={},
            extra={"step_rewards": list(self.rewards[key])},
        )
        return episode, row


def plans(groups: int, size: int) -> "Iterator[GroupPlan]":
    for g in range(groups):
        yield GroupPlan(
            group=g,
            prompt=[{"role": "user", "content": f"group {g}"}],
            indices=tuple(range(g * size, (g + 1) * size)),
            rollout_ids=tuple(f"r-{g}-{k}" for k in range(size)),
            context=cast("RowContext", None),  # the fake player builds its rows without one
        )


def spec_of(env_path: str, **changes: Any) -> "EvalSpec":
    spec = read_eval_spec(resolve_eval_test(env_path))
    return dataclasses.replace(spec, **changes) if changes else spec


async def released(
    stream: "AsyncIterator[ScoredGroup]", player: FakePlayer, order: list[tuple[int, int]], count: int
) -> "list[ScoredGroup]":
    """Set the players' events in ``order`` one at a time, and collect what the stream releases meanwhile, until
    ``count`` groups are out."""
    out: list[ScoredGroup] = []

    async def consume() -> None:
        async for group in stream:
            out.append(group)
            if len(out) == count:
                return

    consumer = asyncio.ensure_future(consume())
    for key in order:
        await asyncio.sleep(0.05)  # the stream starts what its slots allow first
        player.events[key].set()
    await asyncio.wait_for(consumer, 30)
    return out


def test_at_most_slots_episodes_play_at_once_and_they_start_in_plan_order() -> None:
    rewards = {(g, k): [1.0] for g in range(3) for k in range(2)}
    player = FakePlayer(rewards, delays={key: 0.05 for key in rewards})
    meter = SlotMeter()

    async def main() -> "list[ScoredGroup]":
        stream = stream_groups(
            player,
            spec_of(POINTWISE),
            plans(3, 2),
            cast("Generator", FakeGenerator()),
            slots=3,
            body_timeout_s=30,
            meter=meter,
        )
        return [group async for group in stream]

    groups = asyncio.run(main())
    assert player.most_in_flight == 3
    assert player.started == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]
    assert sorted(g.plan.group for g in groups) == [0, 1, 2] and meter.episodes == 6 and meter.cancelled == 0


def test_a_group_is_released_when_it_completes_not_in_plan_order() -> None:
    """Group 0's second episode is the straggler: group 1, planned after it, is released first, and its slot was
    never held for the straggler."""
    rewards = {(g, k): [1.0] for g in range(2) for k in range(2)}
    player = FakePlayer(rewards)

    async def main() -> "list[ScoredGroup]":
        stream = stream_groups(
            player, spec_of(POINTWISE), plans(2, 2), cast("Generator", FakeGenerator()), slots=4, body_timeout_s=30
        )
        return await released(stream, player, [(0, 0), (1, 0), (1, 1), (0, 1)], 2)

    groups = asyncio.run(main())
    assert [g.plan.group for g in groups] == [1, 0]
    assert [[p.request.member for p in g.played] for g in groups] == [[0, 1], [0, 1]]  # member order


def test_pointwise_scores_each_episode_and_groupwise_scores_the_group_together() -> None:
    rewards = {(0, 0): [1.0, 0.0], (0, 1): [1.0, 1.0]}
    for env_path, expected in ((POINTWISE, [0.5, 1.0]), (GROUPWISE, [0.5, 1.0])):
        player = FakePlayer(rewards, delays={(0, 0): 0.01, (0, 1): 0.02})

        async def main() -> "list[ScoredGroup]":
            stream = stream_groups(
                player, spec_of(env_path), plans(1, 2), cast("Generator", FakeGenerator()), slots=2, body_timeout_s=30
            )
            return [group async for group in stream]

        [group] = asyncio.run(main())
        assert [s.score for s in group.scored] == pytest.approx(expected), env_path
    # groupwise is relative to the group: the same rows alone score 1 each
    alone = FakePlayer({(0, 0): [1.0, 0.0]}, delays={(0, 0): 0.01})

    async def single() -> "list[ScoredGroup]":
        stream = stream_groups(
            alone, spec_of(GROUPWISE), plans(1, 1), cast("Generator", FakeGenerator()), slots=1, body_timeout_s=30
        )
        return [group async for group in stream]

    [group] = asyncio.run(single())
    assert [s.score for s in group.scored] == [1.0]


@pytest.mark.parametrize("scope", ["group", "stream"])
def test_an_all_eval_is_scored_per_group_or_over_the_whole_stream(scope: Literal["group", "stream"]) -> None:
    """``all`` over the stream holds every group until the plan is played and scores them in one body call (the
    groupwise body then compares across groups); over each group, a group is released as it completes."""
    rewards = {(0, 0): [1.0], (0, 1): [0.5], (1, 0): [2.0], (1, 1): [2.0]}
    player = FakePlayer(rewards)

    async def main() -> "list[ScoredGroup]":
        stream = stream_groups(
            player,
            spec_of(GROUPWISE, mode="all"),
            plans(2, 2),
            cast("Generator", FakeGenerator()),
            slots=4,
            body_timeout_s=30,
            all_scope=scope,
        )
        return await released(stream, player, [(0, 0), (0, 1), (1, 0), (1, 1)], 2)

    groups = asyncio.run(main())
    scores = {g.plan.group: [s.score for s in g.scored] for g in groups}
    if scope == "group":
        assert scores == {0: pytest.approx([1.0, 0.5]), 1: pytest.approx([1.0, 1.0])}
    else:  # one body call over both groups: relative to the best of all four (2.0)
        assert scores == {0: pytest.approx([0.5, 0.25]), 1: pytest.approx([1.0, 1.0])}


def test_a_failed_episode_is_not_scored_and_says_so() -> None:
    rewards = {(0, 0): [1.0], (0, 1): [1.0]}
    player = FakePlayer(rewards, delays={(0, 0): 0.01, (0, 1): 0.02}, failing=[(0, 1)])

    async def main() -> "list[ScoredGroup]":
        stream = stream_groups(
            player, spec_of(GROUPWISE), plans(1, 2), cast("Generator", FakeGenerator()), slots=2, body_timeout_s=30
        )
        return [group async for group in stream]

    [group] = asyncio.run(main())
    assert group.scored[0].score == 1.0  # the body saw only the finished episode: the best of a group of one
    assert group.scored[1].score is None and group.scored[1].error == FAILED_EPISODE


def test_no_episode_starts_while_may_start_says_no() -> None:
    rewards = {(0, 0): [1.0]}
    player = FakePlayer(rewards, delays={(0, 0): 0.01})
    allowed = asyncio.Event()

    async def main() -> "ScoredGroup":
        stream = stream_groups(
            player,
            spec_of(POINTWISE),
            plans(1, 1),
            cast("Generator", FakeGenerator()),
            slots=2,
            body_timeout_s=30,
            may_start=allowed.is_set,
        )
        consumer = asyncio.ensure_future(stream.__anext__())
        await asyncio.sleep(0.3)
        assert player.started == []  # polled, never started
        allowed.set()
        group = await asyncio.wait_for(consumer, 10)
        await stream.aclose()
        return group

    assert asyncio.run(main()).plan.group == 0 and player.started == [(0, 0)]


def test_a_consumer_that_stops_early_cancels_every_episode_in_flight() -> None:
    rewards = {(g, k): [1.0] for g in range(3) for k in range(2)}
    player = FakePlayer(rewards)
    meter = SlotMeter()

    async def main() -> "ScoredGroup":
        stream = stream_groups(
            player,
            spec_of(POINTWISE),
            plans(3, 2),
            cast("Generator", FakeGenerator()),
            slots=4,
            body_timeout_s=30,
            meter=meter,
        )
        consumer = asyncio.ensure_future(stream.__anext__())
        await asyncio.sleep(0.05)
        player.events[(0, 0)].set()
        player.events[(0, 1)].set()
        first = await asyncio.wait_for(consumer, 10)
        await stream.aclose()  # the consumer is done: what is in flight is cancelled and awaited
        return first

    first = asyncio.run(main())
    assert first.plan.group == 0
    assert sorted(player.cancelled) == [(1, 0), (1, 1), (2, 0), (2, 1)] and player.in_flight == 0
    assert meter.cancelled == 4 and meter.in_flight == 0


def test_an_error_that_is_not_an_episodes_own_raises_and_cancels_the_rest() -> None:
    rewards = {(g, k): [1.0] for g in range(2) for k in range(2)}
    player = FakePlayer(rewards, raising=(0, 0))

    async def main() -> "list[ScoredGroup]":
        stream = stream_groups(
            player, spec_of(POINTWISE), plans(2, 2), cast("Generator", FakeGenerator()), slots=4, body_timeout_s=30
        )
        return await released(stream, player, [(0, 0)], 1)

    with pytest.raises(RuntimeError, match="not an episode's own error"):
        asyncio.run(main())
    assert sorted(player.cancelled) == [(0, 1), (1, 0), (1, 1)] and player.in_flight == 0
