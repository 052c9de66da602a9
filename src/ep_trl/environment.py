"""The one seam to OpenEnv clients: build an environment for an episode and drive it without blocking.

OpenEnv clients come in two shapes. openenv-core 0.3 clients are async (``await env.reset()``) and
``client.sync()`` wraps one in a ``SyncEnvClient`` that runs its own loop in a thread; other clients (openenv
0.10, hand-written ones) are synchronous. Evals usually hand eval-protocol a synchronous client, because its
processor calls ``env.reset()`` without awaiting. Here async clients are awaited on the shared loop (a
``SyncEnvClient`` is unwrapped to its async client), and synchronous ones run in worker threads, so one slow
environment never stalls the other episodes.

Sessions are pooled per rollout call (``EnvPool``): OpenEnv's ``reset()`` starts a fresh episode on an open
session, so an episode that ended cleanly hands its session to the next one instead of paying for a new
connection, a new server-side environment (for BrowserGym, a new browser) and a close.
"""

import asyncio
import inspect
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EnvSettings:
    """How to construct an episode's environment, as the eval's processor configures it."""

    factory: Callable[[], Any] | None = None
    client_cls: type | None = None
    base_url: str | None = None
    request_timeout_s: float = 15.0
    default_headers: Mapping[str, str] | None = None
    tasks: tuple[str, ...] = ()
    task_var: str | None = None
    env_vars: Mapping[str, str] = field(default_factory=dict)
    docker_image: str | None = None
    hub_repo_id: str | None = None
    reset_task_kwarg: str = "task_name"

    def describe(self) -> str:
        if self.factory is not None:
            return f"env_factory {getattr(self.factory, '__qualname__', self.factory)!r}"
        name = getattr(self.client_cls, "__name__", self.client_cls)
        return f"{name}(base_url={self.base_url!r})"

    def check(self) -> None:
        """Fail at construction, not mid-training, when no environment can be built."""
        if self.factory is not None:
            return
        if self.client_cls is None:
            raise ConfigError(
                "The eval's OpenEnvRolloutProcessor has neither env_factory nor env_client_cls; "
                "pass env_factory=... or env_client_cls=... with env_base_url=... to create_openenv_vllm_rollout_func."
            )
        if not self.base_url:
            source = (f"the Hugging Face hub ({self.hub_repo_id!r})" if self.hub_repo_id
                      else f"a Docker image ({self.docker_image!r})")
            raise ConfigError(
                f"The eval builds {self.client_cls.__name__} from {source}; ep_trl does not launch it. Start the "
                "environment server yourself and pass env_base_url='http://127.0.0.1:PORT' (or give the eval an "
                "env_factory)."
            )
        if self.tasks and not self.task_var:
            raise ConfigError("tasks are configured without task_var; set both (as OpenEnvRolloutProcessor requires).")


@dataclass(frozen=True)
class StepOutcome:
    """What one reset or step returned, normalised across client flavours."""

    observation: Any
    reward: float | None
    done: bool


class EnvSession:
    """One environment session: reset, step and close, each bounded by a timeout.

    ``label`` names the episode currently using it in errors; a pooled session is relabelled per episode.
    """

    def __init__(self, client: Any, timeout_s: float, label: str) -> None:
        self._client = client
        self._timeout_s = timeout_s
        self.label = label

    async def reset(self, **kwargs: Any) -> StepOutcome:
        return _outcome(await self._call("reset", **kwargs))

    async def step(self, action: Any) -> StepOutcome:
        return _outcome(await self._call("step", action))

    async def close(self) -> None:
        close = getattr(self._client, "close", None)
        if close is None:
            return
        try:
            await self._call("close")
        except Exception as exc:  # the episode result stands; a leak is worth a warning, not a failure
            logger.warning("closing environment %s failed: %s: %s", self.label, type(exc).__name__, exc)

    async def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        fn = getattr(self._client, method)
        if inspect.iscoroutinefunction(fn):
            pending = fn(*args, **kwargs)
        else:
            pending = asyncio.to_thread(_call_sync, fn, args, kwargs)
        try:
            return await asyncio.wait_for(pending, timeout=self._timeout_s)
        except TimeoutError as exc:
            raise TimeoutError(
                f"environment {self.label}: {method}() did not answer within {self._timeout_s:.0f} s "
                "(raise request_timeout_s if the environment is just slow)"
            ) from exc


def _call_sync(fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    result = fn(*args, **kwargs)
    if inspect.isawaitable(result):  # a sync-looking client that hands back a coroutine
        return asyncio.run(_await(result))
    return result


async def _await(awaitable: Any) -> Any:
    return await awaitable


def _outcome(result: Any) -> StepOutcome:
    if not hasattr(result, "observation"):
        raise TypeError(
            f"environment returned {type(result).__name__}, not an OpenEnv StepResult with .observation/.reward/.done"
        )
    reward = getattr(result, "reward", None)
    return StepOutcome(result.observation, None if reward is None else float(reward), bool(getattr(result, "done", False)))


def _unwrap_sync_client(client: Any) -> Any:
    """Use the async client inside an openenv ``SyncEnvClient`` so no thread is spent per episode."""
    try:
        from openenv.core.sync_client import SyncEnvClient
    except ImportError:
        return client
    if isinstance(client, SyncEnvClient):
        return client.async_client
    return client


async def open_env(settings: EnvSettings, label: str) -> EnvSession:
    """Build the environment client for one episode, as the eval's processor would."""
    if settings.factory is not None:
        client = await asyncio.to_thread(settings.factory)
        if inspect.isawaitable(client):
            client = await client
    else:
        assert settings.client_cls is not None
        client = settings.client_cls(
            base_url=settings.base_url,
            request_timeout_s=settings.request_timeout_s,
            default_headers=settings.default_headers,
        )
    return EnvSession(_unwrap_sync_client(client), timeout_s=max(settings.request_timeout_s, 1.0), label=label)


def reset_kwargs(settings: EnvSettings, task: str | None) -> dict[str, Any]:
    """A local environment server learns its task at reset (OpenEnv's BrowserGym takes ``task_name``)."""
    return {settings.reset_task_kwarg: task} if task is not None else {}


class EnvPool:
    """The environment sessions of one rollout call, reused across its episodes when ``reuse`` is on.

    Why: TRL's own environment support constructs environments once and resets them often, and an OpenEnv
    ``reset()`` starts a new episode whatever the session did before. Reusing a session saves a connection, a
    server-side environment and a close per episode (on a loaded 2-core machine, a fresh session's first
    ``reset`` took 40-120 ms against ~7 ms on an open one: docs/benchmarks.md). A session whose episode
    failed is closed, never reused: its state is unknown. ``aclose()`` closes every session, so nothing outlives
    the call. At most as many sessions exist as episodes run at once. ``reuse=False`` opens one session per
    episode, as eval-protocol's processor does: for environments whose constructor does per-episode work.
    """

    def __init__(self, settings: EnvSettings, reuse: bool = True) -> None:
        self._settings = settings
        self._reuse = reuse
        self._idle: list[EnvSession] = []
        #: Sessions opened during this call (a metric: without reuse, one per episode).
        self.opened = 0

    async def acquire(self, label: str) -> EnvSession:
        """An idle session of this call, else a new one; labelled for ``label``'s errors."""
        if self._idle:
            session = self._idle.pop()
            session.label = label
            return session
        session = await open_env(self._settings, label)
        self.opened += 1
        return session

    async def release(self, session: EnvSession, reusable: bool) -> None:
        """Keep ``session`` for the next episode when it may be reused, else close it."""
        if self._reuse and reusable:
            self._idle.append(session)
        else:
            await session.close()

    async def aclose(self) -> None:
        """Close every idle session (concurrently: closing is one round trip each)."""
        idle, self._idle = self._idle, []
        await asyncio.gather(*(session.close() for session in idle))
