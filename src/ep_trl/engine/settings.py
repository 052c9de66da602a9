"""How the eval's settings, the caller's overrides and the ``GRPOConfig`` combine, as pure functions.

Precedence, highest first:

1. what the caller passes: ``EvalOverrides`` (``overrides=``) and the plain keywords ``env_base_url``,
   ``env_factory``, ``max_concurrent_rollouts`` (a setting given both ways must agree);
2. the eval test: its ``OpenEnvRolloutProcessor`` (environment, prompt builder, action parser, tasks), its first
   ``completion_params`` entry (``max_tokens``, ``stop``, ``stop_token_ids``, ``system_prompt``), ``steps``,
   ``max_concurrent_rollouts`` and first ``evaluation_test_kwargs`` entry;
3. the ``GRPOConfig``: sampling temperature/top-p/top-k/min-p/repetition penalty always come from here (TRL's
   loss assumes them; a differing eval setting is reported), and ``max_completion_length`` is the episode token
   budget unless ``max_episode_tokens`` is given;
4. ep_trl's defaults: ``max_tokens`` 100 per turn (``OpenEnvRolloutProcessor``'s own default).

Overrides are applied first and the result is checked after, so an override can repair what the eval alone
could not run with (a Docker or hub environment given ``env_base_url``). An eval whose environment comes from a
Docker image or a hub repo and has no URL gets its server started by ep_trl (``ep_trl.openenv.servers``).

An eval with any other processor (``SingleTurnRolloutProcessor``, ``AgentRolloutProcessor``, ...) runs that
processor unchanged (``ep_trl.capture``): of the overrides only ``max_tokens``, ``stop``,
``max_concurrent_rollouts`` and ``evaluation_test_kwargs`` apply; the others name parts of the OpenEnv loop and
are refused.

Environment calls are bounded by ``EvalOverrides.request_timeout_s`` when given, else by the eval's
``request_timeout_s`` but never less than a stock OpenEnv client's own 60 s.
"""

import inspect
import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ..errors import ConfigError, UnsupportedEvalError
from ..evalprotocol.processors import ROUTING_KEYS
from ..evalprotocol.spec import STOCK_MESSAGE_TIMEOUT_S, EvalSpec
from ..generation import DEFAULT_MAX_TOKENS, SamplingParams
from ..options import EvalOverrides
from ..trajectory.tokens import TurnLimits, eos_token_ids
from ..trajectory.types import Model, ProcessingClass

logger = logging.getLogger(__name__)


def apply_overrides(spec: EvalSpec, overrides: EvalOverrides) -> EvalSpec:
    """The eval's spec with the caller's overrides in place, then checked as a whole."""
    o = overrides
    if spec.env is None:
        return _apply_to_processor_eval(spec, o)
    env_changes: dict[str, Any] = {}  # EvalOverrides' values, typed there
    if o.env_factory is not None:
        env_changes["factory"] = o.env_factory
    if o.env_client_cls is not None or o.env_base_url is not None:
        env_changes["factory"] = None  # an explicit client/url replaces the eval's factory
    if o.env_replicas is not None:  # a factory stays: it builds each session's client for the replica chosen
        env_changes["replica_urls"] = tuple(o.env_replicas)
        env_changes["url_var"] = o.env_url_var
    for name, field_name in (
        ("env_client_cls", "client_cls"),
        ("env_base_url", "base_url"),
        ("tasks", "tasks"),
        ("task_var", "task_var"),
        ("reset_task_kwarg", "reset_task_kwarg"),
        ("reset_seed", "reset_seed"),
        ("reset_kwargs", "reset_kwargs"),
    ):
        if getattr(o, name) is not None:
            env_changes[field_name] = getattr(o, name)
    # never bound an environment call tighter than the eval's own run would (a stock client waits 60 s per reply),
    # unless the caller asks for a bound explicitly
    env_changes["request_timeout_s"] = (
        o.request_timeout_s
        if o.request_timeout_s is not None
        else max(spec.env.request_timeout_s, STOCK_MESSAGE_TIMEOUT_S)
    )
    params = dict(spec.completion_params)
    if o.max_tokens is not None:
        params["max_tokens"] = o.max_tokens
    if o.stop is not None:
        params["stop"] = list(o.stop)
    merged = replace(
        spec,
        env=replace(spec.env, **env_changes),
        completion_params=params,
        prompt_builder=o.prompt_builder or spec.prompt_builder,
        action_parser=o.action_parser or spec.action_parser,
        max_steps=o.max_steps if o.max_steps is not None else spec.max_steps,
        max_concurrent_rollouts=o.max_concurrent_rollouts or spec.max_concurrent_rollouts,
        evaluation_test_kwargs=(
            o.evaluation_test_kwargs if o.evaluation_test_kwargs is not None else spec.evaluation_test_kwargs
        ),
    )
    check_spec(merged)
    return merged


#: Overrides that only mean something to the OpenEnv loop ep_trl drives itself.
OPENENV_OVERRIDES = (
    "env_factory",
    "env_client_cls",
    "env_base_url",
    "request_timeout_s",
    "prompt_builder",
    "action_parser",
    "tasks",
    "task_var",
    "reset_task_kwarg",
    "max_steps",
    "reset_seed",
    "reset_kwargs",
    "env_replicas",
    "env_url_var",
)


def _apply_to_processor_eval(spec: EvalSpec, o: EvalOverrides) -> EvalSpec:
    """Overrides for an eval whose own processor runs: the model call's settings, concurrency and body kwargs."""
    given = [name for name in OPENENV_OVERRIDES if getattr(o, name) is not None]
    if given:
        raise ConfigError(
            f"{spec.qualified_name} uses {spec.processor_name}, which drives its own environment and "
            f"tools; {given} apply to OpenEnvRolloutProcessor evals only. Change them in the eval."
        )
    params = dict(spec.completion_params)
    if o.max_tokens is not None:
        params["max_tokens"] = o.max_tokens
    if o.stop is not None:
        params["stop"] = list(o.stop)
    merged = replace(
        spec,
        completion_params=params,
        max_concurrent_rollouts=o.max_concurrent_rollouts or spec.max_concurrent_rollouts,
        evaluation_test_kwargs=(
            o.evaluation_test_kwargs if o.evaluation_test_kwargs is not None else spec.evaluation_test_kwargs
        ),
    )
    check_spec(merged)
    return merged


def check_spec(spec: EvalSpec) -> None:
    """Everything a rollout needs from the eval and its overrides, checked before the first episode."""
    if spec.env is not None:
        spec.env.check()
    if spec.max_steps < 1:
        raise ConfigError(
            f"{spec.qualified_name} allows {spec.max_steps} steps; set steps >= 1 in the eval or "
            "EvalOverrides(max_steps=...)."
        )
    if spec.max_concurrent_rollouts < 1:
        raise ConfigError(
            f"{spec.qualified_name} sets max_concurrent_rollouts={spec.max_concurrent_rollouts}; it "
            "must be >= 1 (pass max_concurrent_rollouts=...)."
        )
    _check_body_kwargs(spec)
    max_tokens = spec.completion_params.get("max_tokens")
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        raise ConfigError(
            f"{spec.qualified_name}: completion_params max_tokens={max_tokens!r} must be an integer "
            ">= 1 (or pass EvalOverrides(max_tokens=...))."
        )


def _check_body_kwargs(spec: EvalSpec) -> None:
    """``evaluation_test_kwargs`` must be keyword arguments the body accepts (``row``/``rows`` are its input)."""
    kwargs = dict(spec.evaluation_test_kwargs)
    for reserved in ("row", "rows"):
        if reserved in kwargs:
            raise UnsupportedEvalError(f"{spec.qualified_name}: evaluation_test_kwargs may not contain {reserved!r}.")
    try:
        parameters = inspect.signature(spec.body).parameters
    except (TypeError, ValueError):  # a builtin or C callable: nothing to check against
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return
    unknown = sorted(set(kwargs) - set(parameters))
    if unknown:
        raise ConfigError(
            f"{spec.qualified_name}: evaluation_test_kwargs {unknown} are not parameters of the eval "
            f"body (it takes {list(parameters)}); fix the names in the eval or in "
            "EvalOverrides(evaluation_test_kwargs=...)."
        )


def notes(spec: EvalSpec) -> list[str]:
    """What the user should know once: settings the eval makes that training uses differently, or not at all."""
    found = list(spec.notes)
    if spec.processor is not None:
        params = spec.completion_params
        unused = sorted(
            k for k in ROUTING_KEYS if params.get(k) not in (None, False) and not (k == "n" and params.get(k) == 1)
        )
        if unused:
            found.append(
                f"{spec.qualified_name} sets {unused} in completion_params; training routes its processor's "
                "calls to ep_trl's endpoint (model and api_base per rollout), one choice per call, not "
                "streamed, so these are not used."
            )
    env = spec.env
    if env is not None and env.env_vars and env.base_url and env.factory is None:
        found.append(
            f"{spec.qualified_name} sets env_vars {sorted(env.env_vars)}; the environment server at "
            f"{env.base_url} is given by URL, so setting them is the server's responsibility."
        )
    return found


def sampling_note(spec: EvalSpec, used: SamplingParams) -> str | None:
    """Say when the eval asks for sampling settings that training replaces with the GRPOConfig's (``used``)."""
    trainer_values = {"temperature": used.temperature, "top_p": used.top_p, "top_k": used.top_k}
    asked = {k: spec.completion_params[k] for k in trainer_values if spec.completion_params.get(k) is not None}
    differing = {k: v for k, v in asked.items() if float(v) != float(trainer_values[k])}
    if not differing:
        return None
    return (
        f"{spec.qualified_name} asks for {differing}; training samples with the GRPOConfig's "
        f"{ {k: trainer_values[k] for k in differing} } because TRL's loss and importance ratio assume them."
    )


def turn_limits(
    spec: EvalSpec,
    sampling: SamplingParams,
    budget: int | None,
    processing_class: ProcessingClass,
    model_provider: Callable[[], Model] | None,
    max_model_len: int | None,
) -> TurnLimits:
    """Sampling, token budget, end-of-turn ids and ``max_model_len`` every episode of a rollout call shares: the
    trainer's ``sampling`` with the eval's turn settings, the episode token ``budget``, the end-of-turn ids of the
    processing class and of the model ``model_provider`` gives (when the model is in reach)."""
    params = spec.completion_params
    if not budget:
        raise ConfigError(
            "No episode token budget: set GRPOConfig(max_completion_length=...) or max_episode_tokens=..."
        )
    stop_ids = tuple(int(t) for t in params.get("stop_token_ids") or ())
    stop = params.get("stop") or ()
    sampling = replace(
        sampling,
        max_tokens=int(params.get("max_tokens") or DEFAULT_MAX_TOKENS),
        stop=(stop,) if isinstance(stop, str) else tuple(stop),
        stop_token_ids=stop_ids,
    )
    eos = eos_token_ids(processing_class, model_provider() if model_provider is not None else None)
    return TurnLimits(
        sampling=sampling,
        max_episode_tokens=int(budget),
        stop_token_ids=tuple(dict.fromkeys(eos + stop_ids)),
        max_model_len=max_model_len,
    )
