"""What an OpenEnv episode is played with: the eval's prompt builder and action parser, the settings every episode of
a rollout call shares (:class:`EpisodeConfig`, built by :func:`episode_config`) and which episode to play
(:func:`plan_episode`: task rotation per prompt group, reset seeds and keyword arguments)."""

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeAlias

from ..errors import UnsupportedEvalError
from ..evalprotocol.body import pytest_outcome
from ..evalprotocol.inputs import initial_messages
from ..evalprotocol.spec import EnvSettings, EvalSpec
from ..trajectory.episode import EpisodePlan
from ..trajectory.tokens import TurnLimits
from ..trajectory.types import Prompt
from .client import Action, Observation

#: The eval's prompt builder: ``(observation, step, history) -> user content`` (a string or content parts).
PromptBuilder: TypeAlias = Callable[[Observation, int, list[str]], object]
#: The eval's action parser: ``(model text) -> action`` for the environment's ``step``.
ActionParser: TypeAlias = Callable[[str], Action]


@dataclass(frozen=True)
class EpisodeConfig:
    """Settings shared by every episode of a rollout call."""

    env: EnvSettings
    prompt_builder: PromptBuilder
    action_parser: ActionParser
    max_steps: int
    limits: TurnLimits
    eval_name: str = "the eval"
    #: What the action parser returns for a reply with no action (``action_parser("")``), in a 1-tuple (the fallback
    #: may itself be None); None when the parser raises on it, so that every action it returns is well formed.
    fallback_action: tuple[object] | None = None


def parse_action(action_parser: Callable[[str], object], text: str, eval_name: str) -> object:
    """``action_parser(text)``; a parser that calls ``pytest.skip``/``fail`` raises :func:`pytest_outcome`'s error
    instead (the episode loop and the probe of the parser's fallback both call it so)."""
    try:
        return action_parser(text)
    except BaseException as exc:
        outcome = pytest_outcome(exc, "action parser", eval_name)
        if outcome is not None:
            raise outcome from exc
        raise


def episode_config(spec: EvalSpec, limits: TurnLimits) -> EpisodeConfig:
    """The settings every OpenEnv episode of one rollout call shares."""
    assert spec.env is not None and spec.prompt_builder is not None and spec.action_parser is not None
    return EpisodeConfig(
        env=spec.env,
        prompt_builder=spec.prompt_builder,
        action_parser=spec.action_parser,
        max_steps=spec.max_steps,
        limits=limits,
        eval_name=spec.qualified_name,
        fallback_action=fallback_action(spec.action_parser, spec.qualified_name),
    )


def fallback_action(action_parser: Callable[[str], object], eval_name: str = "the eval") -> tuple[object] | None:
    """What ``action_parser`` returns for a reply with no action in it (``action_parser("")``), in a 1-tuple; None
    when it raises there (a parser with no fallback: an action it returns was found in the text). An action equal
    to the fallback counts as not well formed (``ModelTurn``). A parser that calls ``pytest.skip`` (an eval module
    whose environment import failed) is one clear error here, as in an episode (``pytest_outcome``)."""
    try:
        return (parse_action(action_parser, "", eval_name),)
    except UnsupportedEvalError:  # the parser called pytest.skip: the eval cannot train here
        raise
    except Exception:  # the parser refuses text with no action: it has no fallback, which is what this asks
        return None


def plan_episode(
    prompt: Prompt,
    index: int,
    group: int,
    member: int,
    tasks: Sequence[str],
    system_prompt: str | None,
    reset_seed: Callable[[int], int] | None = None,
    reset_kwargs: Callable[[int], Mapping[str, object]] | None = None,
) -> EpisodePlan:
    """The plan of one episode: ``index`` in its call or stream, run-wide prompt ``group`` (its task:
    ``tasks[group % len(tasks)]``), ``member`` within the group. The eval's ``system_prompt`` is put first
    unless the prompt already has a system message.

    Tasks rotate per prompt group: group ``k`` of the run (counting the groups of earlier calls and, under
    ``accelerate launch``, of the other processes) plays ``tasks[k % len(tasks)]``, and resets with seed
    ``reset_seed(k)`` when the run names reset seeds (every episode of a group plays the same instance), and with
    the keyword arguments ``reset_kwargs(k)`` when the run names any."""
    task = tasks[group % len(tasks)] if tasks else None
    messages = initial_messages(prompt, index)
    if system_prompt and not any(m.get("role") == "system" for m in messages):
        messages = ({"role": "system", "content": system_prompt},) + messages
    return EpisodePlan(
        index=index,
        group=group,
        member=member,
        task=task,
        initial_messages=messages,
        seed=reset_seed(group) if reset_seed is not None else None,
        reset_kwargs=dict(reset_kwargs(group)) if reset_kwargs is not None else None,
    )
