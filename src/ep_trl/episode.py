"""Run one episode: environment reset, then model turn → action → environment step until done.

This mirrors ``OpenEnvRolloutProcessor``'s loop (same prompt builder, same history lines, same action parser,
same step limit) but generates from token ids and records a token-exact trajectory. An error of the
environment, of the eval's action parser or of this episode's generation ends the episode with status "error",
its kind and its message; it never raises into the batch. Any other error (ep_trl's own, a chat template that
cannot render) raises out of the rollout call: it would fail every episode alike.
"""

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .env_pool import EnvPool
from .environment import EnvSession, EnvSettings, StepOutcome
from .errors import ConfigError, UnsupportedEvalError
from .evalprotocol.inputs import strip_row_key
from .evalprotocol.spec import action_label, history_line
from .generation import Generation, Generator
from .trajectory import ChatTemplate, Trajectory, TrajectoryBuilder, TurnLimits

logger = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class EpisodeConfig:
    """Settings shared by every episode of a rollout call."""

    env: EnvSettings
    prompt_builder: Callable[[Any, int, list[str]], Any]
    action_parser: Callable[[str], Any]
    max_steps: int
    limits: TurnLimits
    eval_name: str = "the eval"


@dataclass(frozen=True)
class EpisodeSpec:
    """Which episode this is: its place in the batch, its prompt group and its task."""

    index: int
    group: int
    generation: int
    task: str | None
    initial_messages: tuple[Mapping[str, Any], ...]


@dataclass(frozen=True)
class Episode:
    """One finished (or failed) episode."""

    spec: EpisodeSpec
    trajectory: Trajectory
    messages: tuple[Mapping[str, Any], ...]
    step_rewards: tuple[float, ...]
    actions: tuple[str, ...]
    status: str  # "finished" or "error"
    stop_reason: str  # "done", "max_steps", "token_budget" or "error"
    error: str | None
    error_kind: str | None  # one of FAILURE_KINDS when the episode failed
    duration_s: float
    prompt_tokens: int
    prompt_builder_failures: int = 0
    budget_blocked_tokens: int = 0  # the bridge that no longer fit when stop_reason is "token_budget"
    forked_segments: int = 0  # conversations a processor abandoned (ep_trl.processors.capture), not trained on

    @property
    def num_turns(self) -> int:
        return len(self.trajectory.sampled_segments())


StepCallback = Callable[[Sequence[Mapping[str, Any]], Sequence[float]], None]

#: What may end an episode as failed: the environment (construction, reset, step), the eval's own code (its
#: action parser), or the generation of this episode's turns. Anything else is ep_trl's bug or a configuration
#: error and raises out of the rollout call.
FAILURE_KINDS = ("environment", "eval_code", "generation")


class EpisodeFailure(Exception):
    """An episode ended early by one of :data:`FAILURE_KINDS`; ``cause`` is the original error."""

    def __init__(self, kind: str, cause: BaseException, detail: str | None = None) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}" + (f" ({detail})" if detail else ""))
        self.kind = kind
        self.cause = cause


def ended_episode(spec: EpisodeSpec, failure: EpisodeFailure | None, stop_reason: str, **fields: Any) -> Episode:
    """The ``Episode`` of ``spec``, finished with ``stop_reason``, or, given ``failure``, failed: status and stop reason
    "error", the failure's message and kind. ``fields`` are the rest of :class:`Episode`'s fields."""
    return Episode(
        spec=spec,
        status="error" if failure else "finished",
        stop_reason="error" if failure else stop_reason,
        error=str(failure) if failure else None,
        error_kind=failure.kind if failure else None,
        **fields,
    )


async def _guarded(kind: str, pending: Awaitable[T]) -> T:
    """Await ``pending``; any ``Exception`` it raises fails the episode as ``kind``, except the configuration
    errors ep_trl raises on purpose (they would fail every episode alike)."""
    try:
        return await pending
    except (ConfigError, UnsupportedEvalError):
        raise
    except Exception as exc:
        raise EpisodeFailure(kind, exc) from exc


def pytest_outcome(exc: BaseException, what: str, eval_name: str) -> UnsupportedEvalError | None:
    """An eval's code that calls ``pytest.skip``/``fail``/``exit`` while training: one clear error, not a
    pytest outcome raised through the trainer."""
    try:
        from _pytest.outcomes import OutcomeException
    except ImportError:  # no pytest here: nothing of the kind can be raised
        return None
    if not isinstance(exc, OutcomeException):
        return None
    verb = {"Skipped": "skip", "Failed": "fail", "XFailed": "xfail"}.get(type(exc).__name__, type(exc).__name__)
    return UnsupportedEvalError(
        f"{eval_name}: its {what} called pytest.{verb}({str(exc)!r}) during training. Eval "
        "modules do this when an import they guard failed: the environment's package is probably not importable in "
        "this Python (import the eval module's environment client yourself to see the error)."
    )


@dataclass
class _State:
    """What one episode has done so far (mutable while it runs; frozen into an ``Episode`` at the end)."""

    messages: list[dict[str, Any]]
    builder: TrajectoryBuilder | None = None
    step_rewards: list[float] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)
    history: list[str] = field(default_factory=list)
    prompt_tokens: int = 0
    builder_failures: int = 0
    budget_blocked_tokens: int = 0
    stop_reason: str = "max_steps"


async def run_episode(spec: EpisodeSpec, cfg: EpisodeConfig, template: ChatTemplate, generator: Generator,
                      envs: EnvPool, on_step: StepCallback | None = None) -> Episode:
    """Play one episode on a session from ``envs``; ``on_step(messages, step_rewards)`` is called after every
    environment step. The session goes back to ``envs`` for reuse only if the episode ended cleanly."""
    start = time.perf_counter()
    label = f"episode {spec.index} (task {spec.task!r})"
    state = _State(messages=[dict(m) for m in spec.initial_messages])
    failure: EpisodeFailure | None = None
    session = None
    clean = cancelled = False
    try:
        session, outcome = await _guarded("environment", envs.start(label, spec.task))
        await _play(state, session, outcome, cfg, template, generator, on_step, label)
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
        state.builder = TrajectoryBuilder.start(template.prompt(state.messages or list(spec.initial_messages)))
    return ended_episode(
        spec,
        failure,
        state.stop_reason,
        trajectory=state.builder.build(),
        messages=tuple(state.messages),
        step_rewards=tuple(state.step_rewards),
        actions=tuple(state.actions),
        duration_s=time.perf_counter() - start,
        prompt_tokens=state.prompt_tokens,
        prompt_builder_failures=state.builder_failures,
        budget_blocked_tokens=state.budget_blocked_tokens,
    )


async def _play(state: _State, session: EnvSession, outcome: StepOutcome, cfg: EpisodeConfig,
                template: ChatTemplate, generator: Generator, on_step: StepCallback | None, label: str) -> None:
    """From the reset's outcome: model turn → action → environment step until done, the step limit or the budget."""
    last: Generation | None = None
    for step in range(1, cfg.max_steps + 1):
        if outcome.done:
            state.stop_reason = "done"
            return
        state.messages.append({"role": "user", "content": _user_content(state, cfg, outcome, step, label)})
        if not _extend_context(state, template, cfg, last):
            state.stop_reason = "token_budget"
            state.messages.pop()
            return
        builder = state.builder
        assert builder is not None
        context = builder.context()
        state.prompt_tokens += len(context)
        params = cfg.limits.sampling.with_max_tokens(builder.turn_budget(cfg.limits))
        last = template.sampled_turn(
            await _guarded("generation", generator.generate(context, params, builder.context_images())))
        builder.add_sampled(last)
        text = template.decode(last.token_ids)
        if last.stop_text:
            text = text[: text.find(last.stop_text)] if last.stop_text in text else text
        action = await _guarded("eval_code", _parse(cfg, text))
        state.messages.append({"role": "assistant", "content": text})
        label = action_label(action)  # once: for a pydantic action, a missing action_str is a slow lookup
        state.actions.append(label)
        outcome = await _guarded("environment", session.step(action))
        reward = float(outcome.reward or 0.0)
        state.step_rewards.append(reward)
        state.history.append(history_line(step, action, reward, outcome.observation, label))
        if on_step is not None:
            on_step(state.messages, state.step_rewards)
    state.stop_reason = "done" if outcome.done else "max_steps"


async def _parse(cfg: EpisodeConfig, text: str) -> Any:
    try:
        return cfg.action_parser(text)
    except BaseException as exc:
        outcome = pytest_outcome(exc, "action parser", cfg.eval_name)
        if outcome is not None:
            raise outcome from exc
        raise


def _user_content(state: _State, cfg: EpisodeConfig, outcome: StepOutcome, step: int, label: str) -> Any:
    """The prompt builder's message for this step; if it raises, ``str(observation)``, as the processor does."""
    try:
        return cfg.prompt_builder(outcome.observation, step, state.history)
    except BaseException as exc:
        if not isinstance(exc, Exception):
            raise pytest_outcome(exc, "prompt builder", cfg.eval_name) or exc
        # same fallback as OpenEnvRolloutProcessor, but counted and logged
        state.builder_failures += 1
        logger.warning("%s: prompt_builder raised %s: %s; using str(observation) as the processor does",
                       label, type(exc).__name__, exc)
        return str(outcome.observation)


def _extend_context(state: _State, template: ChatTemplate, cfg: EpisodeConfig, last: Generation | None) -> bool:
    """Add the new user message to the token context (the first prompt, or the masked bridge after a turn);
    False when the bridge and one more token no longer fit the budget."""
    if state.builder is None:
        state.builder = TrajectoryBuilder.start(template.prompt(state.messages))
        n = len(state.builder.prompt_ids)
        check_first_prompt(n, cfg.limits, "shorten the prompt builder's output")
        return True
    assert last is not None
    bridge, realigned = template.bridge(state.messages, state.builder.held(), last, cfg.limits.stop_token_ids)
    if not state.builder.fits(len(bridge.ids) + 1, cfg.limits):
        state.budget_blocked_tokens = len(bridge.ids)
        return False
    state.builder.add_inserted(bridge)
    state.builder.realigned += int(realigned)
    return True


def check_first_prompt(n: int, limits: TurnLimits, fix: str) -> None:
    """A first prompt that leaves no room to sample fails the episode (as generation: the backend's limit)."""
    if limits.max_model_len is not None and n >= limits.max_model_len:
        raise EpisodeFailure("generation", ValueError(
            f"the first prompt is {n} tokens, not below max_model_len {limits.max_model_len}; {fix}"))


def initial_messages(prompt: Any, index: int = 0) -> tuple[dict[str, Any], ...]:
    """TRL hands over the dataset's prompt column: a string or a list of chat messages."""
    shape = ("the dataset's 'prompt' column must hold strings or lists of messages such as "
             "[{'role': 'user', 'content': 'Play the game.'}]")
    if isinstance(prompt, str):
        return ({"role": "user", "content": prompt},)
    if not isinstance(prompt, Sequence) or not all(isinstance(m, Mapping) for m in prompt):
        raise TypeError(f"rollout_func got prompt {index} of type {type(prompt).__name__}; {shape}")
    prompt = strip_row_key(prompt)  # dataset_from_eval's row key, and the None keys a datasets column adds
    for k, message in enumerate(prompt):
        content = message.get("content")
        if not isinstance(message.get("role"), str) or not isinstance(content, (str, list, tuple)):
            raise ConfigError(f"prompt {index}, message {k} is {dict(message)!r}: every message needs a 'role' and a "
                              f"'content' (a string or content parts); {shape}")
    return tuple(dict(m) for m in prompt)
