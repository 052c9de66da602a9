"""Episode sources: where a rollout call's episodes come from, so the rollout never asks which one it holds.

One module per source, each implementing :class:`EpisodeSource`: ``openenv`` (ep_trl drives an
``OpenEnvRolloutProcessor`` eval's environment loop itself) and ``processor`` (any other eval-protocol processor
runs unchanged while ep_trl captures its model calls). ``choice`` picks one for an eval.
"""

import asyncio
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from ..episode import Episode
from ..generation import Generator
from ..rollout_log import RolloutLogWriter
from ..rows import RowContext
from ..trajectory import ChatTemplate, TurnLimits


@dataclass(frozen=True)
class Batch:
    """One rollout call: TRL's prompts (``groups``: the indices of each prompt group; ``first_group``: the run-wide
    number of the first), a rollout id per prompt, and what every episode shares."""

    prompts: Sequence[Any]
    groups: Sequence[Sequence[int]]
    first_group: int
    rollout_ids: Sequence[str]
    limits: TurnLimits
    template: ChatTemplate
    generator: Generator
    context: RowContext
    log: RolloutLogWriter | None


@dataclass(frozen=True)
class Played:
    """A call's episodes in prompt order, the row of each that the eval body scores, and how many environment
    sessions were opened."""

    episodes: list[Episode]
    rows: list[Any]
    env_sessions: int = 0


class EpisodeSource(Protocol):
    """Plays the episodes of rollout calls. ``play`` returns every episode, failed ones included (an episode's own
    error is data); errors that would fail every episode alike raise."""

    def describe(self) -> str:
        """One line for the start-up log: what plays the episodes."""
        ...

    async def play(self, batch: Batch) -> Played: ...

    async def aclose(self) -> None:
        """Release what the source holds (sessions, servers, endpoints); it is not used afterwards."""
        ...


T = TypeVar("T")


async def gather_or_cancel(pending: Sequence[Awaitable[T]]) -> list[T]:
    """Every result, in order; when one raises (an error that is not an episode's own), the others are cancelled
    and waited for before the error propagates, so no episode outlives its call."""
    tasks = [asyncio.ensure_future(p) for p in pending]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
