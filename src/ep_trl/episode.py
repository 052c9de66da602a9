"""Run one episode: environment reset, then model turn → action → environment step until done.

This mirrors ``OpenEnvRolloutProcessor``'s loop (same prompt builder, same history lines, same action parser,
same step limit) but generates from token ids and records a token-exact trajectory. A failure anywhere ends
the episode with status "error" and its message; it never raises into the batch.
"""

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .environment import EnvPool, EnvSettings, reset_kwargs
from .evalprotocol import history_line
from .generation import Generation, Generator, SamplingParams
from .trajectory import ChatTemplate, Trajectory, TrajectoryBuilder

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EpisodeConfig:
    """Settings shared by every episode of a rollout call."""

    env: EnvSettings
    prompt_builder: Callable[[Any, int, list[str]], Any]
    action_parser: Callable[[str], Any]
    max_steps: int
    sampling: SamplingParams
    max_episode_tokens: int
    stop_token_ids: tuple[int, ...]
    max_model_len: int | None = None


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
    duration_s: float
    prompt_tokens: int
    prompt_builder_failures: int = 0

    @property
    def num_turns(self) -> int:
        return len(self.trajectory.sampled_segments())


StepCallback = Callable[[Sequence[Mapping[str, Any]], Sequence[float]], None]


async def run_episode(spec: EpisodeSpec, cfg: EpisodeConfig, template: ChatTemplate, generator: Generator,
                      envs: EnvPool, on_step: StepCallback | None = None) -> Episode:
    """Play one episode on a session from ``envs``; ``on_step(messages, step_rewards)`` is called after every
    environment step. The session goes back to ``envs`` for reuse unless the episode failed."""
    start = time.perf_counter()
    label = f"episode {spec.index} (task {spec.task!r})"
    messages: list[dict[str, Any]] = [dict(m) for m in spec.initial_messages]
    builder: TrajectoryBuilder | None = None
    step_rewards: list[float] = []
    actions: list[str] = []
    history: list[str] = []
    prompt_tokens = 0
    builder_failures = 0
    stop_reason = "max_steps"
    error: str | None = None
    session = None
    try:
        session = await envs.acquire(label)
        outcome = await session.reset(**reset_kwargs(cfg.env, spec.task))
        last: Generation | None = None
        for step in range(cfg.max_steps):
            if outcome.done:
                stop_reason = "done"
                break
            try:
                user_content = cfg.prompt_builder(outcome.observation, step + 1, history)
            except Exception as exc:  # same fallback as OpenEnvRolloutProcessor, but counted and logged
                builder_failures += 1
                logger.warning("%s: prompt_builder raised %s: %s; using str(observation) as the processor does",
                               label, type(exc).__name__, exc)
                user_content = str(outcome.observation)
            messages.append({"role": "user", "content": user_content})
            if builder is None:
                builder = TrajectoryBuilder(tuple(template.prompt_ids(messages)))
                if cfg.max_model_len is not None and len(builder.prompt_ids) >= cfg.max_model_len:
                    raise ValueError(
                        f"the first prompt is {len(builder.prompt_ids)} tokens, not below max_model_len "
                        f"{cfg.max_model_len}; shorten the prompt builder's output"
                    )
            else:
                assert last is not None
                bridge, realigned = template.bridge(messages, builder.context(), last, cfg.stop_token_ids)
                if not _fits(builder, len(bridge) + 1, cfg):
                    stop_reason = "token_budget"
                    messages.pop()
                    break
                builder.add_inserted(bridge)
                builder.realigned += int(realigned)
            max_tokens = _turn_budget(builder, cfg)
            context = builder.context()
            prompt_tokens += len(context)
            last = await generator.generate(context, cfg.sampling.with_max_tokens(max_tokens))
            builder.add_sampled(last)
            text = template.decode(last.token_ids)
            if last.stop_text:
                text = text[: text.find(last.stop_text)] if last.stop_text in text else text
            action = cfg.action_parser(text)
            messages.append({"role": "assistant", "content": text})
            actions.append(getattr(action, "action_str", None) or str(action))
            outcome = await session.step(action)
            reward = float(outcome.reward or 0.0)
            step_rewards.append(reward)
            history.append(history_line(step + 1, action, reward, outcome.observation))
            if on_step is not None:
                on_step(messages, step_rewards)
        else:
            stop_reason = "done" if outcome.done else "max_steps"
    except Exception as exc:
        stop_reason = "error"
        error = f"{type(exc).__name__}: {exc}"
        logger.warning("%s failed after %d steps: %s", label, len(step_rewards), error)
    finally:
        if session is not None:
            await envs.release(session, reusable=error is None)
    if builder is None:  # failed before the first turn: the prompt as far as it is known, no completion
        builder = TrajectoryBuilder(tuple(template.prompt_ids(messages or list(spec.initial_messages))))
    return Episode(
        spec=spec,
        trajectory=builder.build(),
        messages=tuple(messages),
        step_rewards=tuple(step_rewards),
        actions=tuple(actions),
        status="error" if error else "finished",
        stop_reason=stop_reason,
        error=error,
        duration_s=time.perf_counter() - start,
        prompt_tokens=prompt_tokens,
        prompt_builder_failures=builder_failures,
    )


def _fits(builder: TrajectoryBuilder, extra: int, cfg: EpisodeConfig) -> bool:
    """Whether ``extra`` more completion tokens stay within the episode budget and the model's context."""
    if len(builder.completion_ids) + extra > cfg.max_episode_tokens:
        return False
    if cfg.max_model_len is not None and len(builder.prompt_ids) + len(builder.completion_ids) + extra > cfg.max_model_len:
        return False
    return True


def _turn_budget(builder: TrajectoryBuilder, cfg: EpisodeConfig) -> int:
    remaining = cfg.max_episode_tokens - len(builder.completion_ids)
    if cfg.max_model_len is not None:
        remaining = min(remaining, cfg.max_model_len - len(builder.prompt_ids) - len(builder.completion_ids))
    return max(1, min(cfg.sampling.max_tokens, remaining))


def initial_messages(prompt: Any) -> tuple[dict[str, Any], ...]:
    """TRL hands over the dataset's prompt column: a string or a list of chat messages."""
    if isinstance(prompt, str):
        return ({"role": "user", "content": prompt},)
    if isinstance(prompt, Sequence) and all(isinstance(m, Mapping) and "role" in m for m in prompt):
        return tuple(dict(m) for m in prompt)
    raise TypeError(
        f"rollout_func got a prompt of type {type(prompt).__name__}; the dataset's 'prompt' column must hold strings "
        "or lists of {'role', 'content'} messages"
    )
