"""The stream: an eval's episodes as a stream of finished prompt groups, scored by the eval's body.

Both trainer adapters consume the same stream. ``rollout_func`` (:mod:`ep_trl.adapters.rollout_func`) streams a call's
groups and collects them into TRL's dict; the rollout worker of ``AsyncGRPOTrainer``
(:mod:`ep_trl.adapters.async_worker`) consumes an endless stream and turns each group into samples the moment it is
released.

:func:`stream_groups` keeps at most ``slots`` episodes in flight and starts the next episode (of the current group,
else of the next planned group) whenever one ends and ``may_start()`` allows it. Groups are released as they
complete, not in plan order:

* pointwise evals: each finished episode is scored as soon as it ends; its group is released once its last
  episode is scored;
* groupwise evals: a group is scored once its last episode ended;
* ``all`` evals: scored over ``all_scope``: ``"group"`` (each group as it completes; an endless stream has no end
  to wait for) or ``"stream"`` (every group at once when the plan is exhausted, as one rollout call's batch).

Failed episodes are not scored (``Scored(None, ...)``). An error that is not an episode's own (a backend that failed
for good, a body that returns something other than its rows, ep_trl's bug) cancels every episode and body in flight
and raises; so does the consumer closing the stream early.

With ``turn_version``, each episode's turns are generated through a ``VersionedTurns``
(``ep_trl.generation.versioned``) that reads the policy version when the turn is sent;
:attr:`PlayedEpisode.versions` lists them. The version a turn is sent under is never
newer than the weights that generate it, because a trainer changes the server's weights before it announces the new
version (``update_model_version``), and a turn that is queued, retried or held by a paused server is only
generated later. With ``max_episode_images`` a turn whose episode would then hold more images than that is not sent
(``ConfigError``, which ends the stream): a consumer that reserves that many images per episode in flight
(``EvalRolloutWorker(max_buffered_images=...)``) can rely on it.
"""

import asyncio
import time
from collections.abc import AsyncGenerator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Literal

from ..evalprotocol import EvalSpec
from ..evalprotocol.body import Scored
from ..generation import Generator
from ..generation.versioned import VersionedTurns
from ..sources import EpisodePlayer, EpisodeRequest
from ..traininglog.rows import RowContext
from ..trajectory.episode import Episode
from ..trajectory.types import Prompt, Row
from .scoring import FAILED_EPISODE, score_rows

#: Which episodes an ``all`` eval's body scores at once: each prompt group's, or the whole stream's.
AllScope = Literal["group", "stream"]

#: How often a stream that may not start an episode (``may_start()`` false) and waits for nothing looks again.
IDLE_POLL_S = 0.05


@dataclass(frozen=True)
class GroupPlan:
    """One prompt group to play: its run-wide number, its prompt, the stream indices of its episodes (one per
    member of the group), their rollout ids, and the row context of the step it starts under."""

    group: int
    prompt: Prompt
    indices: tuple[int, ...]
    rollout_ids: tuple[str, ...]
    context: RowContext


@dataclass(frozen=True)
class PlayedEpisode:
    """An ended episode, the row the body scores, and the policy version each of its turns was sent under (empty
    when versions are not tracked)."""

    request: EpisodeRequest
    episode: Episode
    row: Row
    versions: tuple[int, ...] = ()


@dataclass(frozen=True)
class ScoredGroup:
    """A prompt group played and scored, as the stream releases it: its episodes in member order and the body's
    verdict on each."""

    plan: GroupPlan
    played: tuple[PlayedEpisode, ...]
    scored: tuple[Scored, ...]
    seconds: float  # from its first episode's start to its release

    @property
    def episodes(self) -> list[Episode]:
        return [p.episode for p in self.played]


class SlotMeter:
    """How busy a stream's episode slots are: the time integral of episodes in flight (``busy_s``), to divide by
    ``slots x`` the wall time for the occupancy; and how many episodes started, and were cancelled in flight when
    the stream ended early (``cancelled``: neither played nor failed)."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.busy_s = 0.0
        self.episodes = 0
        self.cancelled = 0
        self._since = time.monotonic()

    def _advance(self) -> None:
        now = time.monotonic()
        self.busy_s += self.in_flight * (now - self._since)
        self._since = now

    def started(self) -> None:
        self._advance()
        self.in_flight += 1
        self.episodes += 1

    def ended(self) -> None:
        self._advance()
        self.in_flight -= 1

    def busy_until_now(self) -> float:
        """``busy_s`` counted up to this moment."""
        self._advance()
        return self.busy_s


@dataclass(eq=False)
class _GroupInFlight:
    """A prompt group while its episodes play: its ended episodes and their verdicts by member, the next member
    to start, and when its first episode started (mutable until it is released)."""

    plan: GroupPlan
    started: float
    played: dict[int, PlayedEpisode] = field(default_factory=dict)
    scored: dict[int, Scored] = field(default_factory=dict)
    next_member: int = 0

    @property
    def size(self) -> int:
        return len(self.plan.indices)

    def all_played(self) -> bool:
        return len(self.played) == self.size

    def complete(self) -> bool:
        return self.all_played() and len(self.scored) == self.size

    def release(self) -> ScoredGroup:
        order = range(self.size)
        return ScoredGroup(
            self.plan,
            tuple(self.played[k] for k in order),
            tuple(self.scored[k] for k in order),
            time.monotonic() - self.started,
        )


async def stream_groups(
    player: EpisodePlayer,
    spec: EvalSpec,
    plans: Iterator[GroupPlan],
    generator: Generator,
    *,
    slots: int,
    body_timeout_s: float,
    all_scope: AllScope = "group",
    may_start: Callable[[], bool] | None = None,
    turn_version: Callable[[], int] | None = None,
    model_for: Callable[[int], str | None] | None = None,
    meter: SlotMeter | None = None,
    max_episode_images: int | None = None,
) -> AsyncGenerator[ScoredGroup, None]:
    """Play ``plans`` with at most ``slots`` episodes in flight and yield each group once it is complete and scored
    (see the module docstring); ``meter`` counts how busy the slots are. A released group is referenced nowhere in
    the stream once the consumer asks for the next one (its episodes' images are freed with the consumer's copy)."""
    if slots < 1:
        raise ValueError(f"stream_groups needs at least one slot, got {slots}")
    if all_scope not in ("group", "stream"):
        raise ValueError(f"all_scope must be 'group' or 'stream', got {all_scope!r}")
    stream = _Stream(
        player,
        spec,
        plans,
        generator,
        slots=slots,
        body_timeout_s=body_timeout_s,
        hold_all=spec.mode == "all" and all_scope == "stream",
        may_start=may_start,
        turn_version=turn_version,
        model_for=model_for,
        meter=meter,
        max_episode_images=max_episode_images,
    )
    try:
        while True:
            stream.fill_slots()
            if stream.deferred and stream.exhausted and stream.idle:  # all_scope "stream": the plan is played
                deferred = await stream.score_deferred()
                while deferred:  # no loop variable: a yielded group is not kept past its release
                    yield deferred.pop(0).release()
            if stream.idle:
                if stream.exhausted:
                    break
                await asyncio.sleep(IDLE_POLL_S)  # may_start() said no: look again shortly
                continue
            completed = await stream.next_completed()
            while completed:
                yield completed.pop(0).release()
    finally:
        await stream.cancel()


class _Stream:
    """One run of :func:`stream_groups`: where the plan stands, the episodes and body calls in flight and the groups
    they belong to, and the steps that start, end and score them."""

    def __init__(
        self,
        player: EpisodePlayer,
        spec: EvalSpec,
        plans: Iterator[GroupPlan],
        generator: Generator,
        *,
        slots: int,
        body_timeout_s: float,
        hold_all: bool,
        may_start: Callable[[], bool] | None,
        turn_version: Callable[[], int] | None,
        model_for: Callable[[int], str | None] | None,
        meter: SlotMeter | None,
        max_episode_images: int | None,
    ) -> None:
        self._player, self._spec, self._plans, self._generator = player, spec, plans, generator
        self._slots, self._body_timeout_s, self._hold_all = slots, body_timeout_s, hold_all
        self._may_start, self._turn_version, self._model_for, self._meter = may_start, turn_version, model_for, meter
        self._max_episode_images = max_episode_images
        self._episodes: dict[asyncio.Task, tuple[_GroupInFlight, EpisodeRequest, VersionedTurns | None]] = {}
        self._scoring: dict[asyncio.Task, tuple[_GroupInFlight, list[int]]] = {}
        self._starting: _GroupInFlight | None = None  # the group whose episodes are being started
        #: hold_all (an ``all`` eval over a whole call): complete groups waiting for the end of the plan.
        self.deferred: list[_GroupInFlight] = []
        #: Whether the plan has no group left to start.
        self.exhausted = False

    @property
    def idle(self) -> bool:
        """No episode and no body call in flight."""
        return not self._episodes and not self._scoring

    def fill_slots(self) -> None:
        """Start episodes while a slot is free, the consumer allows it and the plan has one."""
        while len(self._episodes) < self._slots and (self._may_start is None or self._may_start()):
            planned = self._next_episode()
            if planned is None:
                return
            self._start(*planned)

    def _next_episode(self) -> tuple[_GroupInFlight, int] | None:
        """The next episode to start: of the group being started, else of the next planned group."""
        group = self._starting
        if group is None or group.next_member >= group.size:
            plan = None if self.exhausted else next(self._plans, None)
            if plan is None:
                self.exhausted = True
                return None
            group = self._starting = _GroupInFlight(plan, time.monotonic())
        group.next_member += 1
        return group, group.next_member - 1

    def _start(self, group: _GroupInFlight, k: int) -> None:
        plan = group.plan
        request = EpisodeRequest(
            index=plan.indices[k],
            group=plan.group,
            member=k,
            prompt=plan.prompt,
            rollout_id=plan.rollout_ids[k],
            context=plan.context,
        )
        turns = (
            VersionedTurns(self._generator, self._turn_version, self._model_for, self._max_episode_images)
            if self._turn_version is not None
            else None
        )
        task = asyncio.ensure_future(self._player.play(request, turns or self._generator))
        self._episodes[task] = (group, request, turns)
        if self._meter is not None:
            self._meter.started()

    async def next_completed(self) -> list[_GroupInFlight]:
        """Wait until an episode or a body call ends (or, with ``may_start`` and a free slot, a poll's time); the
        groups that completed, once each."""
        waiting = self._may_start is not None and len(self._episodes) < self._slots
        done, _ = await asyncio.wait(
            [*self._episodes, *self._scoring],
            timeout=IDLE_POLL_S if waiting else None,
            return_when=asyncio.FIRST_COMPLETED,
        )
        completed = []
        for task in done:
            group = self._episode_ended(task) if task in self._episodes else self._body_returned(task)
            if group.complete():
                completed.append(group)
                if group is self._starting:  # all its episodes started: the next one starts a new group
                    self._starting = None
        return list(dict.fromkeys(completed))  # identity: one release per group

    def _episode_ended(self, task: asyncio.Task) -> _GroupInFlight:
        group, request, turns = self._episodes.pop(task)
        if self._meter is not None:
            self._meter.ended()
        k = request.member
        episode, row = task.result()  # an error that is not the episode's own raises here
        group.played[k] = PlayedEpisode(request, episode, row, tuple(turns.versions) if turns is not None else ())
        if self._generator.failure is not None:  # the backend failed for good: do not train on the rest
            raise self._generator.failure
        if self._spec.mode == "pointwise":
            self._score(group, [k])
        elif group.all_played():
            if self._hold_all:
                self.deferred.append(group)
            else:
                self._score(group, list(range(group.size)))
        return group

    def _body_returned(self, task: asyncio.Task) -> _GroupInFlight:
        group, members = self._scoring.pop(task)
        for k, verdict in zip(members, task.result()):
            group.scored[k] = verdict
        return group

    def _score(self, group: _GroupInFlight, members: list[int]) -> None:
        """Start the body on the finished episodes of ``members``; the failed ones are unscored at once."""
        eligible = [k for _, k in self._finished([(group, k) for k in members])]
        if eligible:
            task = asyncio.ensure_future(
                score_rows(self._spec, [group.played[k].row for k in eligible], self._body_timeout_s)
            )
            self._scoring[task] = (group, eligible)

    async def score_deferred(self) -> list[_GroupInFlight]:
        """Score the finished episodes of every deferred group in one body call (an ``all`` eval over a whole rollout
        call); the groups, no longer deferred."""
        groups, self.deferred = self.deferred, []
        eligible = self._finished([(g, k) for g in groups for k in range(g.size)])
        if eligible:
            verdicts = await score_rows(self._spec, [g.played[k].row for g, k in eligible], self._body_timeout_s)
            for (g, k), verdict in zip(eligible, verdicts):
                g.scored[k] = verdict
        return groups

    @staticmethod
    def _finished(members: list[tuple[_GroupInFlight, int]]) -> list[tuple[_GroupInFlight, int]]:
        """The members whose episode finished; each failed one gets its verdict now (the body never sees it)."""
        finished = []
        for group, k in members:
            if group.played[k].episode.status == "finished":
                finished.append((group, k))
            else:
                group.scored[k] = Scored(None, group.played[k].row, FAILED_EPISODE)
        return finished

    async def cancel(self) -> None:
        """Cancel the episodes and body calls still in flight (the stream ended early, or raised) and wait for them."""
        if self._meter is not None:
            for _ in self._episodes:
                self._meter.ended()
            self._meter.cancelled += len(self._episodes)
        pending = [*self._episodes, *self._scoring]
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
