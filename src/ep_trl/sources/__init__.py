"""Episode sources: where episodes come from, so the stream that plays them never asks which source it holds.

Each source implements :class:`EpisodeSource`: ``ep_trl.openenv.source`` (ep_trl drives an ``OpenEnvRolloutProcessor``
eval's environment loop itself) and ``processor`` (any other eval-protocol processor runs unchanged while ep_trl
captures its model calls).

* ``processor``: episodes of any other processor, its calls captured.

``ep_trl.engine.engine.make_source`` picks the source of an eval; what an episode is, whichever source plays it, is in
``ep_trl.trajectory.episode``.

A source plays one episode at a time for :mod:`ep_trl.engine.stream`, which decides how many run at once, when the
next one starts and when a prompt group is complete: ``session(setup)`` opens what a run of episodes shares (environment
sessions to reuse, the processor's routing key) and yields an :class:`EpisodePlayer`. ``setup`` is the call's
:class:`CallSetup` (chat template, backend, turn limits, log writer), read from its caller once
(``ep_trl.engine.call_setup``).
"""

from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Protocol

from ..generation import Generator
from ..traininglog.rows import RowContext
from ..traininglog.writer import RolloutLogWriter
from ..trajectory.episode import Episode
from ..trajectory.template import ChatTemplate
from ..trajectory.tokens import TurnLimits
from ..trajectory.types import Prompt, Row


@dataclass(frozen=True)
class CallSetup:
    """What every episode of one rollout call (or of a rollout worker's stream) is played with: the chat template,
    the generation backend, the turn limits (sampling, token budget, end-of-turn ids), the ``ep logs`` row context of
    the episodes started under it (its step) and the log writer (None when logging is off)."""

    template: ChatTemplate
    generator: Generator
    limits: TurnLimits
    context: RowContext
    log: RolloutLogWriter | None


@dataclass(frozen=True)
class EpisodeRequest:
    """One episode to play: its place (``index`` in the stream, run-wide prompt ``group``, ``member`` within the
    group), TRL's prompt, its rollout id in ``ep logs``, and the row context of the step it started under."""

    index: int
    group: int
    member: int
    prompt: Prompt
    rollout_id: str
    context: RowContext


class EpisodePlayer(Protocol):
    """Plays the episodes of one session. ``play`` returns the episode, failed or not (an episode's own error is
    data), and the row the eval body scores; errors that would fail every episode alike raise."""

    @property
    def env_sessions(self) -> int:
        """Environment sessions opened so far in this session."""
        ...

    async def play(self, request: EpisodeRequest, generator: Generator) -> tuple[Episode, Row]:
        """One episode, its turns generated with ``generator`` (the shared one, or a wrapper of it that records
        each turn's policy version)."""
        ...


class EpisodeSource(Protocol):
    """Where episodes come from: an eval's environment loop, or its processor."""

    def describe(self) -> str:
        """One line for the start-up log: what plays the episodes."""
        ...

    def check(self, prompts: Sequence[Prompt]) -> None:
        """Raise, naming the first prompt and what is wrong with it, unless every prompt can be played (called
        before any episode starts: a bad prompt would fail every call it is in)."""
        ...

    def session(self, setup: CallSetup) -> AbstractAsyncContextManager[EpisodePlayer]:
        """What a run of episodes shares (a rollout call's, or a rollout worker's whole stream); closed on exit,
        every environment session with it."""
        ...

    async def aclose(self) -> None:
        """Release what the source holds (servers, endpoints); it is not used afterwards."""
        ...
