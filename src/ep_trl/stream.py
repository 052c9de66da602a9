"""The play: an eval's episodes as a stream of finished prompt groups, scored by the eval's body.

Both trainer adapters consume the same stream. ``rollout_func`` (:mod:`ep_trl.rollout`) plays a call's groups and
collects them into TRL's dict; the rollout worker of ``AsyncGRPOTrainer`` (:mod:`ep_trl.rollout_worker`) plays an
endless stream and turns each group into samples the moment it is released.

:func:`play_groups` keeps at most ``slots`` episodes in flight and starts the next episode (of the current group,
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

With ``turn_version``, each episode's turns are generated through a :class:`VersionedTurns` that reads the policy
version when the turn is sent; :attr:`PlayedEpisode.versions` lists them. The version a turn is sent under is never
newer than the weights that generate it, because a trainer changes the server's weights before it announces the new
version (``update_model_version``), and a turn that is queued, retried or held by a paused server is only
generated later.
"""

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from .episode import Episode
from .evalprotocol import EvalSpec
from .generation import Generation, Generator, PromptImages, SamplingParams
from .rows import RowContext
from .scoring import Scored, score_rows
from .sources import EpisodePlayer, EpisodeRequest

#: How often a stream that may not start an episode (``may_start()`` false) and waits for nothing looks again.
IDLE_POLL_S = 0.05


@dataclass(frozen=True)
class GroupPlan:
    """One prompt group to play: its run-wide number, its prompt, the stream indices of its episodes (one per
    generation), their rollout ids, and the row context of the step it starts under."""

    group: int
    prompt: Any
    indices: tuple[int, ...]
    rollout_ids: tuple[str, ...]
    context: RowContext


@dataclass(frozen=True)
class PlayedEpisode:
    """An ended episode, the row the body scores, and the policy version each of its turns was sent under (empty
    when versions are not tracked)."""

    request: EpisodeRequest
    episode: Episode
    row: Any
    versions: tuple[int, ...] = ()


@dataclass(frozen=True)
class FinishedGroup:
    """A released prompt group: its episodes in generation order and the body's verdict on each."""

    plan: GroupPlan
    played: tuple[PlayedEpisode, ...]
    scored: tuple[Scored, ...]
    seconds: float  # from its first episode's start to its release

    @property
    def episodes(self) -> list[Episode]:
        return [p.episode for p in self.played]


class VersionedTurns:
    """The stream's generator as one episode sees it: every turn goes to ``generator``, and the policy version read
    from ``version()`` just before the turn is sent is recorded. ``model_for(version)`` may name the served model
    (a LoRA adapter of that version) the turn must be generated with; None keeps the generator's own."""

    def __init__(self, generator: Generator, version: Callable[[], int],
                 model_for: Callable[[int], str | None] | None = None) -> None:
        self._generator = generator
        self._version = version
        self._model_for = model_for
        self.versions: list[int] = []

    @property
    def name(self) -> str:
        return self._generator.name

    @property
    def max_model_len(self) -> int | None:
        return self._generator.max_model_len

    @property
    def failure(self) -> Any:
        return self._generator.failure

    async def begin_call(self) -> None:
        """The stream's owner begins and ends the shared generator, not an episode."""

    async def end_call(self) -> None:
        """See ``begin_call``."""

    async def aclose(self) -> None:
        """The shared generator is closed by its owner."""

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams,
                       images: PromptImages | None = None) -> Generation:
        version = self._version()
        self.versions.append(version)
        model = self._model_for(version) if self._model_for is not None else None
        if model is None:
            return await self._generator.generate(prompt_ids, params, images)
        generate_as = getattr(self._generator, "generate_as", None)
        if generate_as is None:
            raise TypeError(f"the {self._generator.name} backend cannot generate with a named model ({model!r})")
        return await generate_as(model, prompt_ids, params, images)


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
class _Progress:
    """A group in flight (mutable while it plays)."""

    plan: GroupPlan
    started: float
    played: dict[int, PlayedEpisode] = field(default_factory=dict)
    scored: dict[int, Scored] = field(default_factory=dict)
    next_generation: int = 0

    @property
    def size(self) -> int:
        return len(self.plan.indices)

    def all_played(self) -> bool:
        return len(self.played) == self.size

    def release(self) -> FinishedGroup:
        order = range(self.size)
        return FinishedGroup(self.plan, tuple(self.played[k] for k in order), tuple(self.scored[k] for k in order),
                             time.monotonic() - self.started)


async def play_groups(player: EpisodePlayer, spec: EvalSpec, plans: Iterator[GroupPlan], generator: Generator, *,
                      slots: int, body_timeout_s: float, all_scope: str = "group",
                      may_start: Callable[[], bool] | None = None, turn_version: Callable[[], int] | None = None,
                      model_for: Callable[[int], str | None] | None = None,
                      meter: SlotMeter | None = None) -> AsyncIterator[FinishedGroup]:
    """Play ``plans`` with at most ``slots`` episodes in flight and yield each group once it is complete and scored
    (see the module docstring); ``meter`` counts how busy the slots are."""
    if slots < 1:
        raise ValueError(f"play_groups needs at least one slot, got {slots}")
    if all_scope not in ("group", "stream"):
        raise ValueError(f"all_scope must be 'group' or 'stream', got {all_scope!r}")
    episodes: dict[asyncio.Task, tuple[_Progress, EpisodeRequest, VersionedTurns | None]] = {}
    scoring: dict[asyncio.Task, tuple[_Progress, list[int]]] = {}
    held: list[_Progress] = []  # all_scope "stream": complete groups waiting for the end of the plan
    current: _Progress | None = None
    exhausted = False

    def next_episode() -> tuple[_Progress, int] | None:
        nonlocal current, exhausted
        if current is None or current.next_generation >= current.size:
            if exhausted:
                return None
            plan = next(plans, None)
            if plan is None:
                exhausted = True
                return None
            current = _Progress(plan, time.monotonic())
        k = current.next_generation
        current.next_generation += 1
        return current, k

    def start(progress: _Progress, k: int) -> None:
        plan = progress.plan
        request = EpisodeRequest(index=plan.indices[k], group=plan.group, generation=k, prompt=plan.prompt,
                                 rollout_id=plan.rollout_ids[k], context=plan.context)
        turns = VersionedTurns(generator, turn_version, model_for) if turn_version is not None else None
        episodes[asyncio.ensure_future(player.play(request, turns or generator))] = (progress, request, turns)
        if meter is not None:
            meter.started()

    def score(progress: _Progress, members: list[int]) -> None:
        eligible = [k for k in members if progress.played[k].episode.status == "finished"]
        for k in members:
            if k not in eligible:
                progress.scored[k] = Scored(None, progress.played[k].row, "episode failed; not scored")
        if not eligible:
            return
        rows = [progress.played[k].row for k in eligible]
        task = asyncio.ensure_future(score_rows(spec, rows, [True] * len(rows), [list(range(len(rows)))],
                                                body_timeout_s))
        scoring[task] = (progress, eligible)

    def complete(progress: _Progress) -> bool:
        return progress.all_played() and len(progress.scored) == progress.size

    try:
        while True:
            while len(episodes) < slots and (may_start is None or may_start()):
                planned = next_episode()
                if planned is None:
                    break
                start(*planned)
            if held and exhausted and not episodes and not scoring:  # all_scope "stream": the plan is played
                for progress in await _score_together(spec, held, body_timeout_s):
                    yield progress.release()
                held.clear()
            if not episodes and not scoring:
                if exhausted:
                    break
                await asyncio.sleep(IDLE_POLL_S)  # may_start() said no: look again shortly
                continue
            waiting = may_start is not None and len(episodes) < slots
            done, _ = await asyncio.wait([*episodes, *scoring], timeout=IDLE_POLL_S if waiting else None,
                                         return_when=asyncio.FIRST_COMPLETED)
            released: list[_Progress] = []
            for task in done:
                if task in episodes:
                    progress, request, turns = episodes.pop(task)
                    if meter is not None:
                        meter.ended()
                    k = request.generation
                    episode, row = task.result()  # an error that is not the episode's own raises here
                    progress.played[k] = PlayedEpisode(request, episode, row,
                                                       tuple(turns.versions) if turns is not None else ())
                    if generator.failure is not None:  # the backend failed for good: do not train on the rest
                        raise generator.failure
                    if spec.mode == "pointwise":
                        score(progress, [k])
                    elif progress.all_played():
                        if spec.mode == "all" and all_scope == "stream":
                            held.append(progress)
                        else:
                            score(progress, list(range(progress.size)))
                else:
                    progress, members = scoring.pop(task)
                    for k, verdict in zip(members, task.result()):
                        progress.scored[k] = verdict
                if complete(progress):
                    released.append(progress)
            for progress in dict.fromkeys(released):  # identity: one release per group
                yield progress.release()
    finally:
        if meter is not None:
            for _ in episodes:
                meter.ended()
            meter.cancelled += len(episodes)
        pending = [*episodes, *scoring]
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)



async def _score_together(spec: EvalSpec, groups: list[_Progress], body_timeout_s: float) -> list[_Progress]:
    """Score the finished episodes of ``groups`` in one body call (an ``all`` eval over a whole rollout call)."""
    everyone = [(p, k) for p in groups for k in range(p.size)]
    eligible = [(p, k) for p, k in everyone if p.played[k].episode.status == "finished"]
    for p, k in everyone:
        p.scored[k] = Scored(None, p.played[k].row, "episode failed; not scored")
    if eligible:
        verdicts = await score_rows(spec, [p.played[k].row for p, k in eligible], [True] * len(eligible),
                                    [list(range(len(eligible)))], body_timeout_s)
        for (p, k), verdict in zip(eligible, verdicts):
            p.scored[k] = verdict
    return groups
