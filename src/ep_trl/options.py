"""The option objects of ``create_openenv_vllm_rollout_func``: frozen, validated when built, defaults in one place.

* :class:`EvalOverrides` replaces settings the eval itself makes (its environment, prompt builder, action
  parser, tasks, limits, body keyword arguments). ``None`` keeps the eval's own value.
* :class:`VLLMOptions` tunes the vLLM server backend (concurrency, timeouts, retries, batching, seeding).
* :class:`RolloutOptions` tunes the bridge itself (chat template, environment session reuse, the log store).

Every value is checked when the object is built, with a message that names the value and the fix, so a typo
fails before the trainer is constructed rather than at the first rollout call. The most used settings
(``env_base_url``, ``env_factory``, ``max_concurrent_rollouts``) are also plain keywords of the factory; see
:mod:`ep_trl.engine.settings` for how the keywords, these objects, the eval and the ``GRPOConfig`` combine.
"""

import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Literal

from .errors import ConfigError

if TYPE_CHECKING:  # `import ep_trl` loads this module: the alias is for the checker only
    from .trajectory.types import Settings

Backend = Literal["auto", "trainer", "vllm"]
BACKENDS: tuple[str, ...] = ("auto", "trainer", "vllm")


def _positive_int(owner: str, name: str, value: object, *, minimum: int = 1) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{owner}({name}={value!r}): {name} must be an integer >= {minimum}.")


def _positive_float(owner: str, name: str, value: object, *, allow_zero: bool = False) -> None:
    if value is None:
        return
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
        or (value == 0 and not allow_zero)
    ):
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigError(f"{owner}({name}={value!r}): {name} must be a finite number of seconds {bound}.")


def _callable(owner: str, name: str, value: object) -> None:
    if value is not None and not callable(value):
        raise ConfigError(f"{owner}({name}={value!r}): {name} must be callable, not {type(value).__name__}.")


def _strings(owner: str, name: str, value: object, example: str) -> tuple[str, ...] | None:
    """A sequence of non-empty strings as a tuple; a bare string is refused (it would be split into letters)."""
    if value is None:
        return None
    if isinstance(value, str) or not isinstance(value, Sequence) or not value:
        raise ConfigError(
            f"{owner}({name}={value!r}): {name} must be a non-empty list of strings, e.g. {name}={example}."
        )
    bad = [v for v in value if not isinstance(v, str) or not v]
    if bad:
        raise ConfigError(f"{owner}({name}=...): every entry must be a non-empty string; got {bad!r}.")
    return tuple(value)


def _url(owner: str, name: str, value: object) -> None:
    if value is None:
        return
    if not isinstance(value, str) or not value.startswith(("http://", "https://", "ws://", "wss://")):
        raise ConfigError(f"{owner}({name}={value!r}): {name} must be a URL such as 'http://127.0.0.1:8001'.")


@dataclass(frozen=True)
class EvalOverrides:
    """Settings that replace the eval's own for training; ``None`` (the default) keeps the eval's value.

    Attributes:
        env_factory: builds one environment client per episode (replaces the processor's).
        env_client_cls: the OpenEnv client class, used with ``env_base_url``.
        env_base_url: the URL of an environment server that is already running.
        request_timeout_s: seconds each environment reset/step may take.
        prompt_builder: ``(observation, step, history) -> user content``.
        action_parser: ``(model text) -> action``.
        tasks: the task names rotated per prompt group (a list, even for one task).
        task_var: the environment variable that names the task for the eval's processor.
        reset_task_kwarg: the ``reset()`` keyword that names the task on a running server (``"task_name"``).
        max_steps: environment steps per episode.
        reset_seed: ``(group) -> seed``: each episode's ``reset(seed=...)``, from its run-wide prompt group number
            (OpenEnv's ``Environment.reset(seed=...)``); the episodes of a group play the same instance. ``ep-trl
            train --held-out`` sets it to keep training off the held-out seeds.
        reset_kwargs: ``(group) -> {name: value}``: more keyword arguments of each episode's ``reset()``, from its
            run-wide prompt group number (e.g. a variant of the instance the environment's reset takes). ``ep-trl
            train --held-out-reset-kwarg`` sets it to play each held-out instance under each value.
        max_tokens: tokens per model turn.
        stop: stop strings per model turn (a single string is one stop string).
        max_concurrent_rollouts: episodes run at once.
        evaluation_test_kwargs: keyword arguments of the eval body (checked against its signature).
        input_dataset: JSONL files of rows read in place of the eval's ``input_dataset``, through its own
            ``dataset_adapter`` (``ep_trl.evalprotocol.eval_rows``); the eval must read an ``input_dataset``.
        env_replicas: the URLs of several servers of the same environment (replicas); each session goes to the one
            with the fewest sessions of the call open (docs/scaling.md). An eval whose ``env_factory`` reads its
            server's URL from an environment variable needs ``env_url_var``.
        env_url_var: with ``env_replicas`` and an ``env_factory``: the variable the factory reads the URL from; it
            names the chosen replica while the factory builds each session's client.
    """

    env_factory: Callable[[], object] | None = None
    env_client_cls: type | None = None
    env_base_url: str | None = None
    request_timeout_s: float | None = None
    prompt_builder: Callable[[object, int, list[str]], object] | None = None
    action_parser: Callable[[str], object] | None = None
    tasks: Sequence[str] | None = None
    task_var: str | None = None
    reset_task_kwarg: str | None = None
    max_steps: int | None = None
    reset_seed: Callable[[int], int] | None = None
    reset_kwargs: Callable[[int], Mapping[str, object]] | None = None
    max_tokens: int | None = None
    stop: Sequence[str] | str | None = None
    max_concurrent_rollouts: int | None = None
    evaluation_test_kwargs: "Settings | None" = None
    input_dataset: Sequence[str] | None = None
    env_replicas: Sequence[str] | None = None
    env_url_var: str | None = None

    def __post_init__(self) -> None:
        owner = "EvalOverrides"
        object.__setattr__(
            self, "input_dataset", _strings(owner, "input_dataset", self.input_dataset, "['rows.jsonl']")
        )
        for name in ("env_factory", "prompt_builder", "action_parser", "reset_seed", "reset_kwargs"):
            _callable(owner, name, getattr(self, name))
        if self.env_client_cls is not None and not isinstance(self.env_client_cls, type):
            raise ConfigError(
                f"{owner}(env_client_cls={self.env_client_cls!r}): pass the client class itself "
                "(e.g. MyEnv), not an instance or a name."
            )
        _url(owner, "env_base_url", self.env_base_url)
        replicas = _strings(owner, "env_replicas", self.env_replicas, "['http://127.0.0.1:8001', ...]")
        object.__setattr__(self, "env_replicas", replicas)
        for url in replicas or ():
            _url(owner, "env_replicas", url)
        if replicas is not None and (not replicas or len(set(replicas)) != len(replicas)):
            raise ConfigError(f"{owner}(env_replicas={list(replicas)!r}): give one URL or more, each once.")
        if replicas is not None and self.env_base_url is not None:
            raise ConfigError(f"{owner}: env_base_url and env_replicas both name the server; pass one of them.")
        if self.env_url_var is not None and replicas is None:
            raise ConfigError(f"{owner}(env_url_var=...): it routes env_replicas' sessions; add env_replicas.")
        _positive_float(owner, "request_timeout_s", self.request_timeout_s)
        object.__setattr__(self, "tasks", _strings(owner, "tasks", self.tasks, "['click-test']"))
        stop = (self.stop,) if isinstance(self.stop, str) else self.stop
        object.__setattr__(self, "stop", _strings(owner, "stop", stop, "['\\n\\n']"))
        for name in ("task_var", "reset_task_kwarg", "env_url_var"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value.isidentifier()):
                raise ConfigError(f"{owner}({name}={value!r}): {name} must be a name such as 'TASK'.")
        for name in ("max_steps", "max_tokens", "max_concurrent_rollouts"):
            _positive_int(owner, name, getattr(self, name))
        if self.evaluation_test_kwargs is not None:
            if not isinstance(self.evaluation_test_kwargs, Mapping):
                raise ConfigError(
                    f"{owner}(evaluation_test_kwargs=...): must be a mapping of keyword arguments, "
                    f"not {type(self.evaluation_test_kwargs).__name__}."
                )
            object.__setattr__(self, "evaluation_test_kwargs", dict(self.evaluation_test_kwargs))
        if self.env_factory is not None and (self.env_client_cls is not None or self.env_base_url is not None):
            raise ConfigError(
                f"{owner}: env_factory and env_client_cls/env_base_url both say how to build the "
                "environment; pass one of them."
            )

    def merged(self, **keywords: object) -> "EvalOverrides":
        """These overrides with the factory's plain keywords added; a keyword set in both places must agree."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        for name, value in keywords.items():
            if value is None:
                continue
            if values[name] is not None and values[name] != value:
                raise ConfigError(
                    f"{name} is given twice, as a keyword ({value!r}) and in EvalOverrides "
                    f"({values[name]!r}); pass it once."
                )
            values[name] = value
        return EvalOverrides(**values)


@dataclass(frozen=True)
class VLLMOptions:
    """How the vLLM server backend talks to the server.

    Attributes:
        max_in_flight: most episode turns in flight at once (concurrent episodes' turns overlap up to this; the
            server batches them). ``None`` (the default): no cap of the client's own, so every episode in flight
            (``max_concurrent_rollouts``: an episode has at most one turn out) can have its turn at the server; a
            cap of 64 held 256 episodes in flight to 64 turns at the server (docs/benchmarks.md, the bridge at a
            GPU's concurrency). The colocated engine batches at most this many turns (``None``: 64).
        request_timeout_s: total time one request may take before it counts as failed.
        max_retries: a timed-out, dropped, 5xx or 429 request is retried this many times, waiting
            ``retry_backoff_s * 2**k`` seconds; then the rollout call raises ``GenerationError`` naming the
            request. Other 4xx (e.g. a prompt over ``max_model_len``) raise at once.
        retry_backoff_s: the first retry's wait.
        connect_timeout_s: how long the first contact (``GET /v1/models``) and each connection may take; an
            unreachable server fails within it, naming the URL.
        batch_window_s: turns with the same sampling settings that arrive within this many seconds of each other
            go out as one request with a list of prompts (0 = one request per turn).
        seed: a base seed for reproducible sampling; each request gets its own seed derived from it (one seed
            for a whole GRPO group would make its samples identical). ``None`` lets vLLM pick.
    """

    max_in_flight: int | None = None
    request_timeout_s: float = 120.0
    max_retries: int = 3
    retry_backoff_s: float = 0.5
    connect_timeout_s: float = 10.0
    batch_window_s: float = 0.005
    seed: int | None = None

    def __post_init__(self) -> None:
        owner = "VLLMOptions"
        _positive_int(owner, "max_in_flight", self.max_in_flight)
        _positive_int(owner, "max_retries", self.max_retries, minimum=0)
        _positive_float(owner, "request_timeout_s", self.request_timeout_s)
        _positive_float(owner, "connect_timeout_s", self.connect_timeout_s)
        _positive_float(owner, "retry_backoff_s", self.retry_backoff_s, allow_zero=True)
        _positive_float(owner, "batch_window_s", self.batch_window_s, allow_zero=True)
        _positive_int(owner, "seed", self.seed, minimum=0)


@dataclass(frozen=True)
class RolloutOptions:
    """How the bridge itself behaves, whatever the eval and the backend.

    Attributes:
        chat_template_kwargs: passed to ``apply_chat_template`` (e.g. ``{"enable_thinking": False}``).
        reuse_env_sessions: an episode that ended cleanly hands its environment session to the next episode of
            the same call, which starts with ``reset()`` (as TRL's own environments are constructed once and reset
            often); failed episodes' sessions are closed, and all are closed when the call ends. False opens one
            session per episode, as eval-protocol's processor does: for environments whose constructor does
            per-episode work.
        log_home: send logged rows to ``<log_home>/.eval_protocol/logs.db`` instead of ``~/.eval_protocol/logs.db``
            (view them with ``HOME=<log_home> ep logs``).
        body_timeout_s: how long one call of the eval body may take; past it, its rows are unscored (counted).
        max_signal_free_calls: raise ``NoTrainingSignalError`` after this many consecutive rollout calls in which
            no episode got a score (every one failed or went unscored): such steps train on nothing.
        worker_processes: play each call's episodes in this many shard processes (1: in the trainer's process).
            Each shard process has its own event loop, endpoint and environment sessions and plays a contiguous share of
            the prompt groups, up to the eval's ``max_concurrent_rollouts`` at once; the results come back in
            prompt order. For when the trainer's one Python process is the limit (an eval's processor whose model
            client costs milliseconds per call, with generation on a GPU server); needs a vLLM server backend
            (docs/benchmarks.md, the bridge's ceiling).
        stop_grace_s: the process's stop grace: how long after a SIGTERM it may take to end by itself (its own
            ``finally`` blocks, a checkpoint saved there, then ep_trl's close at exit) before ep_trl writes the
            ``ep logs`` rows still queued, closes what it opened and ends it with status 143. ``None``: the
            ``EP_TRL_STOP_GRACE_S`` environment variable, else 25 s (Kubernetes and Slurm send SIGKILL 30 s after
            SIGTERM by default). Set it below your scheduler's wait (``docker stop`` waits 10 s). One per process:
            the newest rollout function's (docs/failures.md).
    """

    chat_template_kwargs: "Settings" = field(default_factory=dict)
    reuse_env_sessions: bool = True
    log_home: str | os.PathLike | None = None
    body_timeout_s: float = 300.0
    max_signal_free_calls: int = 3
    worker_processes: int = 1
    stop_grace_s: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.chat_template_kwargs, Mapping):
            raise ConfigError(
                f"RolloutOptions(chat_template_kwargs={self.chat_template_kwargs!r}): must be a mapping "
                "such as {'enable_thinking': False}."
            )
        object.__setattr__(self, "chat_template_kwargs", dict(self.chat_template_kwargs))
        if not isinstance(self.reuse_env_sessions, bool):
            raise ConfigError(f"RolloutOptions(reuse_env_sessions={self.reuse_env_sessions!r}): must be True or False.")
        if self.log_home is not None and not isinstance(self.log_home, (str, os.PathLike)):
            raise ConfigError(f"RolloutOptions(log_home={self.log_home!r}): must be a directory path.")
        _positive_float("RolloutOptions", "body_timeout_s", self.body_timeout_s)
        _positive_int("RolloutOptions", "max_signal_free_calls", self.max_signal_free_calls)
        _positive_int("RolloutOptions", "worker_processes", self.worker_processes)
        _positive_float("RolloutOptions", "stop_grace_s", self.stop_grace_s)


def check_keywords(
    backend: object,
    vllm_base_url: object,
    max_episode_tokens: object,
    log_rollouts: object,
    overrides: object,
    vllm: object,
    options: object,
) -> None:
    """Check the factory's plain keywords (the option objects check themselves when built)."""
    if backend not in BACKENDS:
        raise ConfigError(f"backend must be one of {BACKENDS}, not {backend!r}.")
    if vllm_base_url is not None:
        if not isinstance(vllm_base_url, str) or not vllm_base_url.startswith(("http://", "https://")):
            raise ConfigError(
                f"vllm_base_url={vllm_base_url!r}: pass the server's root URL, e.g. 'http://127.0.0.1:8000'."
            )
        if vllm_base_url.rstrip("/").endswith("/v1"):
            raise ConfigError(
                f"vllm_base_url={vllm_base_url!r} ends with /v1; pass the server's root URL "
                f"({vllm_base_url.rstrip('/')[:-3]!r}): ep_trl adds /v1/... itself."
            )
    if max_episode_tokens is not None and (
        isinstance(max_episode_tokens, bool) or not isinstance(max_episode_tokens, int) or max_episode_tokens < 1
    ):
        raise ConfigError(
            f"max_episode_tokens={max_episode_tokens!r} must be an integer >= 1 (or None for the "
            "GRPOConfig's max_completion_length)."
        )
    if not isinstance(log_rollouts, bool):
        raise ConfigError(f"log_rollouts={log_rollouts!r} must be True or False.")
    for value, cls, name in (
        (overrides, EvalOverrides, "overrides"),
        (vllm, VLLMOptions, "vllm"),
        (options, RolloutOptions, "options"),
    ):
        if value is not None and not isinstance(value, cls):
            raise ConfigError(f"{name}= takes an ep_trl.{cls.__name__}(...), not {type(value).__name__}.")
