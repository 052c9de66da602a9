"""Read an eval test's configuration: its processor's environment settings, prompt builder, action parser, tasks,
limits and scoring body, before any override."""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Literal, TypeAlias, TypedDict, get_args

from ..errors import ConfigError, UnsupportedEvalError
from ..trajectory.types import Settings
from ._private import private_attr, private_name
from .resolve import EvalTest, eval_file

if TYPE_CHECKING:  # eval-protocol ships no types: to the checker the name documents what is held
    from eval_protocol.pytest.rollout_processor import RolloutProcessor

#: How an eval's body scores rows: one at a time, one prompt's group at a time, or every row of the run at once.
EvalMode = Literal["pointwise", "groupwise", "all"]
EVAL_MODES: tuple[EvalMode, ...] = get_args(EvalMode)


#: An environment client: an OpenEnv ``EnvClient`` (either distribution), a ``SyncEnvClient``, or any object with
#: ``reset``/``step`` (and maybe ``close``). Nothing more is assumed: ``EnvSession`` reads its methods by name and
#: decides from what they are and return how to drive them.
EnvClient: TypeAlias = object
#: ``env_factory``: builds one environment client per episode (or an awaitable of one).
EnvFactory: TypeAlias = Callable[[], EnvClient | Awaitable[EnvClient]]

#: A stock OpenEnv client waits this long for each reply (``message_timeout_s``); ep_trl never bounds an
#: environment call tighter than the eval's own run would, so this is the floor of the default per-call bound.
STOCK_MESSAGE_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class EnvSettings:
    """How to construct an episode's environment, as the eval's processor configures it (after overrides).

    ``task_urls`` maps each task to the URL of a server that plays only that task (servers ep_trl started
    with the eval's ``task_var`` set); sessions of a task then go to its server and ``reset`` names no task.
    """

    factory: EnvFactory | None = None
    client_cls: type | None = None
    base_url: str | None = None
    request_timeout_s: float = STOCK_MESSAGE_TIMEOUT_S
    default_headers: Mapping[str, str] | None = None
    tasks: tuple[str, ...] = ()
    task_var: str | None = None
    env_vars: Mapping[str, str] = field(default_factory=dict)
    docker_image: str | None = None
    hub_repo_id: str | None = None
    reset_task_kwarg: str = "task_name"
    task_urls: Mapping[str, str] = field(default_factory=dict)
    #: ``(group) -> seed`` for each episode's ``reset(seed=...)`` (``EvalOverrides.reset_seed``); None: no seed.
    reset_seed: Callable[[int], int] | None = None
    #: ``(group) -> {name: value}``: more keyword arguments of each episode's reset (``EvalOverrides.reset_kwargs``).
    reset_kwargs: Callable[[int], Mapping[str, object]] | None = None
    #: Servers of the same environment each session may go to (``EvalOverrides.env_replicas``); () for one server.
    replica_urls: tuple[str, ...] = ()
    #: The variable an ``env_factory`` reads its server's URL from, set to the chosen replica while it builds.
    url_var: str | None = None

    def describe(self) -> str:
        if self.factory is not None:
            return f"env_factory {getattr(self.factory, '__qualname__', self.factory)!r}"
        name = getattr(self.client_cls, "__name__", self.client_cls)
        if self.replica_urls:
            return f"{name} on {len(self.replica_urls)} replicas"
        if self.task_urls:
            return f"{name} on {len(self.task_urls)} local servers, one per task"
        return f"{name}(base_url={self.base_url!r})"

    def needs_launch(self) -> bool:
        """The eval names a Docker image or hub repo and no URL: a server must be started for it."""
        return (
            self.factory is None
            and self.client_cls is not None
            and not self.base_url
            and not self.task_urls
            and not self.replica_urls
            and bool(self.docker_image or self.hub_repo_id)
        )

    def url_for(self, task: str | None) -> str | None:
        return self.task_urls.get(task or "", self.base_url) if self.task_urls else self.base_url

    def check(self) -> None:
        """Fail at construction, not mid-training, when no environment can be built."""
        if self.replica_urls and self.factory is not None and self.url_var is None:
            raise ConfigError(
                f"{len(self.replica_urls)} environment replicas, and the eval builds its clients with env_factory: "
                "name the environment variable the factory reads its server's URL from, EvalOverrides(env_url_var="
                "...) (ep-trl train: --env-url-var), so each session's client reaches the replica chosen for it."
            )
        if self.factory is not None:
            return
        if self.client_cls is None:
            raise ConfigError(
                "The eval's OpenEnvRolloutProcessor has neither env_factory nor env_client_cls; pass env_factory=... "
                "or EvalOverrides(env_client_cls=..., env_base_url=...). If the eval module imports its environment "
                "client inside try/except ImportError, that import failed: check that the environment's package "
                "is installed in this Python."
            )
        if self.needs_launch():
            return  # ep_trl starts its server (ep_trl.openenv.servers), which fails clearly if it cannot
        if not self.base_url and not self.task_urls and not self.replica_urls:
            source = (
                f"the Hugging Face hub ({self.hub_repo_id!r})"
                if self.hub_repo_id
                else f"a Docker image ({self.docker_image!r})"
            )
            raise ConfigError(
                f"The eval builds {self.client_cls.__name__} from {source} and ep_trl found no server to start for "
                "it. Start the environment server yourself and pass env_base_url='http://127.0.0.1:PORT', or pass "
                "provider=... (an OpenEnv runtime provider), or give the eval an env_factory."
            )
        if self.tasks and not self.task_var and not self.base_url:
            raise ConfigError("tasks are configured without task_var; set both (as OpenEnvRolloutProcessor requires).")


@dataclass(frozen=True)
class EvalSpec:
    """Everything the bridge takes from one eval test (after overrides, see ``ep_trl.engine.settings``)."""

    name: str
    qualified_name: str
    mode: EvalMode
    body: Callable[..., object]
    evaluation_test_kwargs: Settings
    completion_params: Settings
    max_steps: int
    max_concurrent_rollouts: int
    #: The OpenEnv loop's parts (``OpenEnvRolloutProcessor`` evals); None for any other processor.
    prompt_builder: Callable[[object, int, list[str]], object] | None
    action_parser: Callable[[str], object] | None
    env: EnvSettings | None
    notes: tuple[str, ...] = field(default=())
    #: Every other processor, run unchanged (``ep_trl.capture``), and what eval-protocol hands it in its config.
    processor: RolloutProcessor | None = None
    processor_settings: Settings = field(default_factory=dict)

    @property
    def processor_name(self) -> str:
        return type(self.processor).__name__ if self.processor is not None else "OpenEnvRolloutProcessor"


class _Common(TypedDict):
    """The fields of :class:`EvalSpec` that every eval has, whatever its processor."""

    name: str
    qualified_name: str
    mode: EvalMode
    body: Callable[..., object]
    evaluation_test_kwargs: dict[str, object]
    completion_params: dict[str, object]
    max_steps: int
    max_concurrent_rollouts: int


def read_eval_spec(eval_test: EvalTest) -> EvalSpec:
    """Extract the eval's processor (for OpenEnv evals: its environment, prompt builder, parser and tasks), limits
    and scoring body."""
    openenv_cls = private_name("eval_protocol.pytest.openenv_rollout_processor", "OpenEnvRolloutProcessor")
    params = eval_test.wrapper.__ep_params__
    processor = params.rollout_processor
    _check_processor(processor, eval_test)
    given = str(params.mode)
    mode = next((known for known in EVAL_MODES if known == given), None)
    if mode is None:
        raise UnsupportedEvalError(f"{eval_test.qualified_name} has mode {given!r}; supported modes: {EVAL_MODES}.")
    body = private_attr(eval_test.wrapper, "_origin_func")
    if not callable(body):
        raise UnsupportedEvalError(
            f"{eval_test.qualified_name}: its _origin_func is not callable; cannot reach the body."
        )

    notes: list[str] = []
    common = _Common(
        name=eval_test.name,
        qualified_name=eval_test.qualified_name,
        mode=mode,
        body=body,
        evaluation_test_kwargs=_first_setting(
            params.evaluation_test_kwargs, "evaluation_test_kwargs", eval_test, notes
        ),
        completion_params=_first_setting(params.completion_params, "completion_params", eval_test, notes),
        max_steps=int(params.steps),
        max_concurrent_rollouts=int(params.max_concurrent_rollouts),
    )
    if isinstance(processor, openenv_cls):
        return EvalSpec(
            **common,
            prompt_builder=processor.prompt_builder,
            action_parser=processor.action_parser,
            env=_env_settings(processor),
            notes=tuple(notes),
        )
    model = common["completion_params"].get("model")
    if isinstance(model, Mapping):
        raise UnsupportedEvalError(
            f"{eval_test.qualified_name}: completion_params['model'] is a mapping {sorted(model)} (several models per "
            "row); ep_trl routes each rollout's calls by one model name, so give the eval one model to train."
        )
    kwargs = dict(params.rollout_processor_kwargs or {})
    if type(processor).__name__ == "MCPGymRolloutProcessor" and kwargs.get("server_mode", "per_run") == "per_run":
        kwargs["server_mode"] = "shared"
        notes.append(
            f"{eval_test.qualified_name}: MCPGymRolloutProcessor starts a server per processor call "
            "('per_run', on one port); ep_trl calls the processor once per row, so training runs it with "
            "server_mode='shared': one server for the run, stopped when the process exits."
        )
    script = params.server_script_path
    if script is not None:  # relative paths are the eval repository's: found beside the eval's package if need be
        resolved = eval_file(eval_test, script, "server_script_path")
        script = resolved.path
        if resolved.note:
            notes.append(resolved.note)
    settings = {"mcp_config_path": params.mcp_config_path or "", "server_script_path": script, "kwargs": kwargs}
    return EvalSpec(
        **common,
        prompt_builder=None,
        action_parser=None,
        env=None,
        notes=tuple(notes),
        processor=processor,
        processor_settings=settings,
    )


def tools_offered(spec: EvalSpec, rows: Iterable[object]) -> str | None:
    """How the eval offers the model tools, in words; None when it offers none. ``MCPGymRolloutProcessor`` always does
    (its environment's tools), ``AgentRolloutProcessor`` with an MCP config (its servers' tools), and any processor
    whose rows carry ``tools``. An OpenEnv loop offers none (its prompt builder writes the prompt)."""
    if spec.processor is None:
        return None
    kind = type(spec.processor).__name__
    if kind == "MCPGymRolloutProcessor":
        return "its MCPGymRolloutProcessor offers the model the environment's tools"
    if kind == "AgentRolloutProcessor" and spec.processor_settings.get("mcp_config_path"):
        return (
            f"its AgentRolloutProcessor offers the model the tools of its MCP servers "
            f"({spec.processor_settings['mcp_config_path']})"
        )
    carrying = sum(1 for row in rows if getattr(row, "tools", None))
    if carrying:
        return f"{carrying} of its rows offer the model tools (their `tools`)"
    return None


#: Processors whose model calls happen outside this process (a remote server, GitHub's runners) and whose rows
#: come back from Fireworks tracing: nothing here can capture their tokens.
REMOTE_PROCESSORS = ("RemoteRolloutProcessor", "GithubActionRolloutProcessor")


def _check_processor(processor: object, eval_test: EvalTest) -> None:
    """Every eval-protocol processor that calls a model passes; not one that eval-protocol put in place of a class
    whose import failed, and not the no-op one (it calls no model: nothing to train)."""
    from eval_protocol.pytest.rollout_processor import RolloutProcessor

    kind = type(processor).__name__ if processor is not None else "no rollout_processor"
    if not isinstance(processor, RolloutProcessor):
        raise UnsupportedEvalError(
            f"{eval_test.qualified_name} uses {kind}, which is not an eval-protocol "
            "RolloutProcessor; give the eval one (docs/processors.md lists what trains)."
        )
    hint = _swallowed_import_hint(eval_test)
    if kind == "SingleTurnRolloutProcessor" and hint:
        raise UnsupportedEvalError(
            f"{eval_test.qualified_name} uses SingleTurnRolloutProcessor, which eval-protocol "
            "puts in place of rollout_processor=None." + hint
        )
    if kind in REMOTE_PROCESSORS:
        raise UnsupportedEvalError(
            f"{eval_test.qualified_name} uses {kind}: the model is called on another machine and the row comes back "
            "from Fireworks tracing, so the tokens cannot be captured here. Train with a processor that runs in this "
            "process (SingleTurnRolloutProcessor, AgentRolloutProcessor, ...; docs/processors.md)."
        )
    if kind == "NoOpRolloutProcessor":
        raise UnsupportedEvalError(
            f"{eval_test.qualified_name} uses NoOpRolloutProcessor (or EP_USE_NO_OP_ROLLOUT_PROCESSOR=1 is set): it "
            "calls no model, so there is nothing to train. Give the eval the processor it runs with."
        )


def _swallowed_import_hint(eval_test: EvalTest) -> str:
    """Eval modules guard their environment import (``except ImportError: Env = None``) and then pass
    ``rollout_processor=None``, which eval-protocol replaces with its default processor: name what is None."""
    module = sys.modules.get(eval_test.module_name)
    missing = (
        sorted(
            name for name, value in vars(module).items() if value is None and name[:1].isupper() and not name.isupper()
        )
        if module
        else []
    )
    if not missing:
        return ""
    return (
        f" In {eval_test.module_name}, {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} None: the "
        "module probably guards an import that failed here, and eval-protocol put its default processor in "
        "place of the missing one. Check that the environment's package is installed in this Python."
    )


def _env_settings(processor: object) -> EnvSettings:
    read = partial(private_attr, processor)

    return EnvSettings(
        factory=read("_provided_env_factory"),
        client_cls=read("_env_client_cls"),
        base_url=read("_env_base_url"),
        request_timeout_s=float(read("_request_timeout_s")),
        default_headers=read("_default_headers"),
        tasks=tuple(str(t) for t in (read("_tasks") or ())),
        task_var=read("_task_var"),
        env_vars=dict(read("_env_vars") or {}),
        docker_image=read("_docker_image"),
        hub_repo_id=read("_hub_repo_id"),
    )


def _first_setting(
    values: Mapping[str, object] | Iterable[Mapping[str, object] | None] | None,
    what: str,
    eval_test: EvalTest,
    notes: list[str],
) -> dict[str, object]:
    """eval-protocol parametrizes over lists of settings; training uses the first one and says so."""
    if values is None:
        return {}
    if isinstance(values, Mapping):
        return dict(values)
    entries = [dict(v) for v in values if v is not None]
    if len(entries) > 1:
        notes.append(
            f"{eval_test.qualified_name} lists {len(entries)} {what}; training uses the first: {entries[0]!r}."
        )
    return entries[0] if entries else {}


def action_label(action: object) -> str:
    """How OpenEnvRolloutProcessor names an action: its ``action_str``, else ``str(action)``."""
    return getattr(action, "action_str", None) or str(action)


def history_line(step: int, action: object, reward: float, observation: object, label: str | None = None) -> str:
    """The history entry OpenEnvRolloutProcessor gives prompt builders, reproduced so prompts match the eval;
    ``label``: ``action_label(action)`` when the caller has it already."""
    label = action_label(action) if label is None else label
    error_flag = getattr(observation, "last_action_error", False)
    return f"Step {step}: {label} -> reward {reward:+.2f}{' ERROR' if error_flag else ''}"
