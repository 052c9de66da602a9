"""Run one episode: environment reset, then model turn → action → environment step until done.

This mirrors ``OpenEnvRolloutProcessor``'s loop (same prompt builder, same history lines, same action parser,
same step limit) but generates from token ids and records a token-exact trajectory. An error of the
environment, of the eval's action parser or of this episode's generation ends the episode with status "error",
its kind and its message; it never raises into the batch. Every other error (ep_trl's own, a chat template that
cannot render) raises out of the rollout call: it would fail every episode alike.
"""

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from ..errors import ConfigError, UnsupportedEvalError
from ..evalprotocol.body import pytest_outcome
from ..evalprotocol.spec import action_label, history_line
from ..generation import Generation, Generator
from ..trajectory.episode import (
    Episode,
    EpisodeFailure,
    EpisodePlan,
    FailureKind,
    ModelTurn,
    StopReason,
    check_first_prompt,
    ended_episode,
)
from ..trajectory.template import ChatTemplate, EpisodeImages
from ..trajectory.tokens import TrajectoryBuilder
from ..trajectory.types import Messages, MessagesView
from .client import Action, EnvSession, StepOutcome
from .episode import EpisodeConfig, parse_action
from .pool import EnvPool

logger = logging.getLogger(__name__)

T = TypeVar("T")

StepCallback = Callable[[MessagesView, Sequence[float]], None]


async def _guarded(kind: FailureKind, pending: Awaitable[T]) -> T:
    """Await ``pending``; any ``Exception`` it raises fails the episode as ``kind``, except the configuration
    errors ep_trl raises on purpose (they would fail every episode alike)."""
    try:
        return await pending
    except (ConfigError, UnsupportedEvalError):
        raise
    except Exception as exc:
        raise EpisodeFailure(kind, exc) from exc


@dataclass
class _State:
    """What one episode has done so far (mutable while it runs; frozen into an ``Episode`` at the end)."""

    messages: Messages
    builder: TrajectoryBuilder | None = None
    step_rewards: list[float] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)
    turns: list[ModelTurn] = field(default_factory=list)
    history: list[str] = field(default_factory=list)
    prompt_tokens: int = 0
    builder_failures: int = 0
    budget_blocked_tokens: int = 0
    stop_reason: StopReason = "max_steps"
    instance: Mapping[str, object] | None = None
    #: The episode's images, each processed once (``ChatTemplate.prepare_images``, before each render).
    images: EpisodeImages = field(default_factory=EpisodeImages)


async def run_episode(
    plan: EpisodePlan,
    cfg: EpisodeConfig,
    template: ChatTemplate,
    generator: Generator,
    envs: EnvPool,
    on_step: StepCallback | None = None,
) -> Episode:
    """Play one episode on a session from ``envs``; ``on_step(messages, step_rewards)`` is called after every
    environment step. The session goes back to ``envs`` for reuse only if the episode ended cleanly."""
    start = time.perf_counter()
    label = (
        f"episode {plan.index} (task {plan.task!r}"
        + (f", seed {plan.seed}" if plan.seed is not None else "")
        + "".join(f", {name} {value!r}" for name, value in (plan.reset_kwargs or {}).items())
        + ")"
    )
    state = _State(messages=[dict(m) for m in plan.initial_messages])
    failure: EpisodeFailure | None = None
    session = None
    clean = cancelled = False
    try:
        session, outcome = await _guarded("environment", envs.start(label, plan.task, plan.seed, plan.reset_kwargs))
        state.instance = instance_of(outcome.observation)
        await _take_turns(state, session, outcome, cfg, template, generator, on_step, episode=label)
        clean = True
    except EpisodeFailure as exc:
        failure = exc
        logger.warning("%s failed (%s) after %d steps: %s", label, exc.kind, len(state.step_rewards), exc)
    except asyncio.CancelledError:  # the call is ending: neither played nor failed
        cancelled = True
        raise
    finally:
        if session is not None:
            await envs.release(session, reusable=clean, cancelled=cancelled)
    if state.builder is None:  # failed before the first turn: the prompt as far as it is known, no completion
        known: MessagesView = state.messages
        if not known:
            known = list(plan.initial_messages)
        await template.prepare_images(known, state.images)
        state.builder = TrajectoryBuilder.start(template.prompt(known, images=state.images))
    return ended_episode(
        plan,
        failure,
        state.stop_reason,
        trajectory=template.carried(state.builder.build(), state.images),
        messages=tuple(state.messages),
        step_rewards=tuple(state.step_rewards),
        actions=tuple(state.actions),
        turns=tuple(state.turns),
        duration_s=time.perf_counter() - start,
        prompt_tokens=state.prompt_tokens,
        prompt_builder_failures=state.builder_failures,
        budget_blocked_tokens=state.budget_blocked_tokens,
        instance=state.instance,
    )


def instance_of(observation: object) -> dict[str, object] | None:
    """What a reset observation says the episode plays: a copy of its ``metadata`` (OpenEnv's ``Observation`` field)
    when that is a non-empty mapping, else None. A stock OpenEnv server leaves ``metadata`` off the wire, so for a
    served environment it is the client that fills it (``ep_trl.envs.doors.DoorsEnv`` does)."""
    metadata = getattr(observation, "metadata", None)
    return dict(metadata) if isinstance(metadata, Mapping) and metadata else None


async def _take_turns(
    state: _State,
    session: EnvSession,
    outcome: StepOutcome,
    cfg: EpisodeConfig,
    template: ChatTemplate,
    generator: Generator,
    on_step: StepCallback | None,
    *,
    episode: str,
) -> None:
    """From the reset's outcome: model turn → action → environment step until done, the step limit or the budget.
    ``episode`` names the episode in its warnings (an action's label has a name of its own)."""
    last: Generation | None = None
    for step in range(1, cfg.max_steps + 1):
        if outcome.done:
            state.stop_reason = "done"
            return
        state.messages.append({"role": "user", "content": _user_content(state, cfg, outcome, step, episode)})
        await template.prepare_images(state.messages, state.images)  # the new screenshots, in a thread
        if not _extend_held(state, template, cfg, last):
            state.stop_reason = "token_budget"
            state.messages.pop()
            return
        builder = state.builder
        assert builder is not None
        prompt_ids = builder.held_ids()
        state.prompt_tokens += len(prompt_ids)
        params = cfg.limits.sampling.with_max_tokens(builder.turn_budget(cfg.limits))
        last = template.sampled_turn(
            await _guarded("generation", generator.generate(prompt_ids, params, builder.held_images()))
        )
        builder.add_sampled(last)
        text = template.decode(last.token_ids)
        if last.stop_text:
            text = text[: text.find(last.stop_text)] if last.stop_text in text else text
        try:
            action = await _guarded("eval_code", _parse(cfg, text))
        except EpisodeFailure:
            state.turns.append(ModelTurn(text, well_formed=False))  # the parser raised: no action
            raise
        state.turns.append(ModelTurn(text, well_formed=well_formed(cfg, action)))
        state.messages.append({"role": "assistant", "content": text})
        action_text = action_label(action)  # once: for a pydantic action, a missing action_str is a slow lookup
        state.actions.append(action_text)
        outcome = await _guarded("environment", session.step(action))
        reward = float(outcome.reward or 0.0)
        state.step_rewards.append(reward)
        state.history.append(history_line(step, action, reward, outcome.observation, action_text))
        if on_step is not None:
            on_step(state.messages, state.step_rewards)
    state.stop_reason = "done" if outcome.done else "max_steps"


def well_formed(cfg: EpisodeConfig, action: Action) -> bool:
    """An action the parser found in the text: anything but its fallback (``cfg.fallback_action``)."""
    if cfg.fallback_action is None:
        return True
    try:
        return bool(action != cfg.fallback_action[0])
    except (TypeError, ValueError):  # an action whose comparison raises (an array's ambiguous truth): not the fallback
        return True


async def _parse(cfg: EpisodeConfig, text: str) -> Action:
    return parse_action(cfg.action_parser, text, cfg.eval_name)


def _user_content(state: _State, cfg: EpisodeConfig, outcome: StepOutcome, step: int, episode: str) -> object:
    """The prompt builder's message for this step; if it raises, ``str(observation)``, as the processor does."""
    try:
        return cfg.prompt_builder(outcome.observation, step, state.history)
    except BaseException as exc:
        if not isinstance(exc, Exception):
            raise pytest_outcome(exc, "prompt builder", cfg.eval_name) or exc
        # same fallback as OpenEnvRolloutProcessor, but counted and logged
        state.builder_failures += 1
        logger.warning(
            "%s: prompt_builder raised %s: %s; using str(observation) as the processor does",
            episode,
            type(exc).__name__,
            exc,
        )
        return str(outcome.observation)


def _extend_held(state: _State, template: ChatTemplate, cfg: EpisodeConfig, last: Generation | None) -> bool:
    """Add the new user message to the held tokens (the first prompt, or the masked bridge after a turn);
    False when the bridge and one more token no longer fit the budget. The conversation's images are processed
    already (``ChatTemplate.prepare_images``): rendering it here, on the event loop, processes none."""
    if state.builder is None:
        state.builder = TrajectoryBuilder.start(template.prompt(state.messages, images=state.images))
        n = len(state.builder.prompt_ids)
        check_first_prompt(n, cfg.limits, "shorten the prompt builder's output")
        return True
    assert last is not None
    bridge, realigned = template.bridge(
        state.messages, state.builder.held(), last, cfg.limits.stop_token_ids, images=state.images
    )
    if not state.builder.fits(len(bridge.ids) + 1, cfg.limits):
        state.budget_blocked_tokens = len(bridge.ids)
        return False
    state.builder.add_inserted(bridge)
    state.builder.realigned += int(realigned)
    return True
