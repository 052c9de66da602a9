"""The one seam to OpenEnv clients: build an environment for an episode and drive it without blocking.

OpenEnv clients come in three shapes. openenv-core 0.3 clients are async (``await env.reset()``) and
``client.sync()`` wraps one in a ``SyncEnvClient`` that runs its own loop in a thread; openenv 0.10 clients
have plain methods that return an awaitable when called from a running event loop and block otherwise;
hand-written clients are often plain synchronous objects. OpenEnv clients (either distribution) are called on
the shared loop and what they return is awaited (a ``SyncEnvClient`` is unwrapped to its async client);
anything else runs in pooled threads, so one slow environment never stalls the other episodes. A stock client
class is built with the parameters its constructor accepts (``client_kwargs``), never more.

The sessions of a rollout call are pooled in ``ep_trl.openenv.pool``.

Every wait is bounded: connecting (``connect_timeout_s`` of a stock client, 10 s), each reset and step
(``request_timeout_s``: the eval's, but never below a stock client's own 60 s unless set explicitly with
``EvalOverrides``), building a client with ``env_factory`` (the same bound) and waiting for a free session on a
server at capacity (``ep_trl.openenv.pool.CAPACITY_WAIT_S``).
"""

import asyncio
import functools
import inspect
import logging
import threading
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from importlib import metadata
from typing import TypeAlias, TypeVar

from ..evalprotocol.spec import EnvClient, EnvSettings
from ..runtime.processes import exported
from ..runtime.threads import run_blocking
from ..trajectory.types import Settings

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: What an environment's ``reset`` or ``step`` reports: only the eval's prompt builder (and ``str``) reads it.
Observation: TypeAlias = object
#: What the eval's action parser makes of the model's text, passed to ``step`` as is.
Action: TypeAlias = object

#: A stock OpenEnv client's connect timeout (``connect_timeout_s``).
STOCK_CONNECT_TIMEOUT_S = 10.0
#: How long an ``env_factory`` call may go on after its episode stopped waiting (to close a client built late)
#: before its thread is abandoned and counted as stuck.
FACTORY_ABANDON_S = 300.0
#: How long the close of a cancelled episode's session is waited for. The close is sent at once, but a server busy
#: in a step confirms it only when the step ends (a websocket close handshake waits up to 10 s for that): the
#: server ends the session then, and the cancelled call does not wait for it.
CANCELLED_CLOSE_S = 1.0


@dataclass(frozen=True)
class StepOutcome:
    """What one reset or step returned, normalised across client flavours."""

    observation: Observation
    reward: float | None
    done: bool


#: The PyPI distributions that install the ``openenv`` package (each is also the name of ep_trl's extra for it).
OPENENV_DISTRIBUTIONS = ("openenv", "openenv-core")


def check_openenv() -> str:
    """Which OpenEnv distribution is installed (``"openenv 0.10.0"``), checked against ep_trl's supported ranges.

    Exactly one must be installed: both write the same ``openenv`` package, so with both one's files overwrite
    the other's. Neither is a hard dependency of ep_trl, so installing ep_trl never replaces the one a user has.
    """
    from ..errors import VersionError
    from ..runtime.versions import require_supported

    found = {}
    for distribution in OPENENV_DISTRIBUTIONS:
        try:
            found[distribution] = metadata.version(distribution)
        except metadata.PackageNotFoundError:
            continue
    if not found:
        raise VersionError(
            "No OpenEnv is installed. Install one of its two distributions with ep_trl: "
            "pip install 'ep-trl[openenv]' (openenv, the newest) or pip install 'ep-trl[openenv-core]' "
            "(what OpenEnv's own environment packages depend on)."
        )
    if len(found) > 1:
        raise VersionError(
            f"Both OpenEnv distributions are installed ({found}); they write the same openenv package, "
            "so one's files overwrote the other's. Keep one: pip uninstall -y openenv openenv-core && "
            "pip install 'ep-trl[openenv]' (or 'ep-trl[openenv-core]')."
        )
    ((distribution, version),) = found.items()
    require_supported(distribution)
    return f"{distribution} {version}"


def _is_openenv_client(client: EnvClient) -> bool:
    """An OpenEnv ``EnvClient`` of the installed distribution (0.10's dispatch by running loop, 0.3's coroutines)."""
    try:
        from openenv.core.env_client import EnvClient
    except ImportError:
        return False
    return isinstance(client, EnvClient)


class EnvSession:
    """One environment session: reset, step and close, each bounded by a timeout.

    How a client is driven is decided by what it is and confirmed by what its calls return. openenv-core 0.3
    clients have coroutine methods; openenv 0.10 clients have plain methods that return an awaitable when an event
    loop is running (and block otherwise): both are called on the loop and what they return is awaited. Every
    other client is synchronous and runs in a pooled thread, so one slow environment never stalls the loop.
    ``label`` names the episode currently using it in errors; a pooled session is relabelled per episode.
    """

    def __init__(self, client: EnvClient, timeout_s: float, label: str) -> None:
        self._client = client
        self._timeout_s = timeout_s
        self._on_loop = _is_openenv_client(client) or inspect.iscoroutinefunction(getattr(client, "reset", None))
        self.label = label
        #: The server this session belongs to (its URL; None for an env_factory client), for capacity accounting.
        self.server: str | None = None
        #: Not reset yet: a refusal then says something about the server, not about this session's history.
        self.fresh = True

    async def reset(self, **kwargs: object) -> StepOutcome:
        return _outcome(await self._call("reset", kwargs=kwargs))

    async def step(self, action: Action) -> StepOutcome:
        return _outcome(await self._call("step", (action,)))

    async def close(self, cancelled: bool = False) -> None:
        """Close the client; the session of a ``cancelled`` episode is waited for ``CANCELLED_CLOSE_S`` at most."""
        close = getattr(self._client, "close", None)
        if close is None:
            return
        try:
            await self._call("close", timeout_s=CANCELLED_CLOSE_S if cancelled else None)
        except TimeoutError as exc:
            if not cancelled:
                logger.warning("closing environment %s failed: %s", self.label, exc)
                return
            logger.info(
                "environment %s: its episode was cancelled and the server did not confirm the close within "
                "%g s (busy in a step); it ends the session when it does",
                self.label,
                CANCELLED_CLOSE_S,
            )
        except Exception as exc:  # the episode result stands; a leak is worth a warning, not a failure
            logger.warning("closing environment %s failed: %s: %s", self.label, type(exc).__name__, exc)

    async def _call(
        self,
        method: str,
        args: tuple[object, ...] = (),
        kwargs: Mapping[str, object] | None = None,
        timeout_s: float | None = None,
    ) -> object:
        fn = getattr(self._client, method)
        kwargs = kwargs or {}
        timeout_s = self._timeout_s if timeout_s is None else timeout_s
        try:
            if self._on_loop:  # awaited in this task under a deadline: no task of its own per call (wait_for's)
                async with asyncio.timeout(timeout_s):
                    return await _settle(fn(*args, **kwargs))
            return await run_blocking(
                lambda: _call_sync(fn, args, kwargs), timeout_s=timeout_s, what=f"environment {self.label}: {method}()"
            )
        except TimeoutError as exc:
            raise TimeoutError(
                f"environment {self.label}: {method}() did not answer within {timeout_s:g} s; if the "
                "environment is just slow, raise EvalOverrides(request_timeout_s=...)"
            ) from exc


async def _settle(result: object) -> object:
    """The value of a client call made on the loop: awaited if the client handed back an awaitable."""
    return await result if inspect.isawaitable(result) else result


def _call_sync(fn: Callable[..., object], args: tuple[object, ...], kwargs: Mapping[str, object]) -> object:
    result = fn(*args, **kwargs)
    if inspect.isawaitable(result):  # a sync-looking client that hands back a coroutine
        return asyncio.run(_await(result))
    return result


async def _await(awaitable: Awaitable[T]) -> T:
    return await awaitable


def _outcome(result: object) -> StepOutcome:
    if not hasattr(result, "observation"):
        raise TypeError(
            f"environment returned {type(result).__name__}, not an OpenEnv StepResult with .observation/.reward/.done"
        )
    reward = getattr(result, "reward", None)
    return StepOutcome(
        result.observation, None if reward is None else float(reward), bool(getattr(result, "done", False))
    )


def _unwrap_sync_client(client: EnvClient) -> EnvClient:
    """Use the async client inside an openenv ``SyncEnvClient`` so no thread is spent per episode."""
    try:
        from openenv.core.sync_client import SyncEnvClient
    except ImportError:
        return client
    if isinstance(client, SyncEnvClient):
        return client.async_client
    return client


def constructor_parameters(client_cls: type) -> set[str]:
    """The keyword arguments ``client_cls(...)`` accepts; through ``**kwargs`` to the base classes' ones."""
    names: set[str] = set()
    for klass in client_cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        parameters = inspect.signature(init).parameters.values()
        names.update(p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
        if not any(p.kind is p.VAR_KEYWORD for p in parameters):
            break
    names.discard("self")
    return names


def client_kwargs(settings: EnvSettings, base_url: str) -> dict[str, object]:
    """What ``client_cls(...)`` is built with: the URL, and the eval's timeout and headers mapped onto the
    parameters this client accepts (a stock OpenEnv client takes ``message_timeout_s`` and, since 0.10,
    ``headers``; eval-protocol's own clients take ``request_timeout_s`` and ``default_headers``). Nothing the
    client does not accept is passed."""
    assert settings.client_cls is not None
    accepted = constructor_parameters(settings.client_cls)
    timeout = settings.request_timeout_s
    headers = dict(settings.default_headers) if settings.default_headers else None
    offered: Settings = {
        "message_timeout_s": timeout,
        "request_timeout_s": timeout,
        "connect_timeout_s": min(STOCK_CONNECT_TIMEOUT_S, timeout),
        "headers": headers,
        "default_headers": headers,
    }
    kwargs = {name: value for name, value in offered.items() if name in accepted and value is not None}
    kwargs["base_url"] = base_url
    return kwargs


async def open_env(settings: EnvSettings, label: str, task: str | None = None, url: str | None = None) -> EnvSession:
    """Build the environment client for one episode, as the eval's processor would; ``url``: the replica chosen
    for it (``settings.replica_urls``), else the eval's server."""
    timeout = settings.request_timeout_s
    if settings.factory is not None:
        factory = settings.factory
        if url is not None and settings.url_var is not None:
            factory = functools.partial(_built_for, factory, settings.url_var, url)
        # the thread outlives this episode's wait (bounded by ``timeout`` below) so that a client built late can be
        # closed; only a factory still running after FACTORY_ABANDON_S is given up on and counted as stuck
        building = asyncio.ensure_future(
            run_blocking(factory, timeout_s=FACTORY_ABANDON_S, what=f"environment {label}: env_factory()")
        )
        try:
            client = await asyncio.wait_for(asyncio.shield(building), timeout)
        except TimeoutError as exc:
            building.add_done_callback(_close_orphan)  # if it is ever built: close it, do not leak it
            raise TimeoutError(f"environment {label}: env_factory() did not return within {timeout:g} s") from exc
        except asyncio.CancelledError:  # the call is ending: let the client being built be closed, not leaked
            await asyncio.wait([building], timeout=timeout)
            if building.done():
                await _close_built(building)
            else:
                building.add_done_callback(_close_orphan)
            raise
        if inspect.isawaitable(client):
            client = await asyncio.wait_for(_settle(client), timeout)
    else:
        assert settings.client_cls is not None
        url = url or settings.url_for(task)
        assert url is not None
        client = settings.client_cls(**client_kwargs(settings, url))
    return EnvSession(_unwrap_sync_client(client), timeout_s=timeout, label=label)


#: Held while an ``env_factory`` builds a client with ``url_var`` naming its replica: the variable is the process's.
_EXPORT_LOCK = threading.Lock()


def _built_for(factory: Callable[[], object], url_var: str, url: str) -> object:
    """``factory()`` with ``os.environ[url_var]`` set to ``url`` while it runs (the previous value put back): an eval's
    factory reads its server's URL from the variable, as ``evals/eval_letters.py``'s ``make_env`` does. Why not
    pass the URL: the factory is the eval's, called with no arguments by its own processor."""
    with _EXPORT_LOCK, exported(url_var, url):
        return factory()


async def _close_built(building: "asyncio.Future[EnvClient | Awaitable[EnvClient]]") -> None:
    """Close the client an ``env_factory`` built for an episode that no longer needs it."""
    if building.cancelled() or building.exception() is not None:
        return
    client = _unwrap_sync_client(building.result())
    await EnvSession(client, timeout_s=STOCK_CONNECT_TIMEOUT_S, label="abandoned by its episode").close()


def _close_orphan(building: "asyncio.Future[EnvClient | Awaitable[EnvClient]]") -> None:
    """Close a client whose construction finished after its episode stopped waiting for it."""
    task = asyncio.get_running_loop().create_task(_close_built(building))
    _closing.add(task)
    task.add_done_callback(_closing.discard)


_closing: set["asyncio.Task[None]"] = set()
