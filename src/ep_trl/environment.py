"""The one seam to OpenEnv clients: build an environment for an episode and drive it without blocking.

OpenEnv clients come in three shapes. openenv-core 0.3 clients are async (``await env.reset()``) and
``client.sync()`` wraps one in a ``SyncEnvClient`` that runs its own loop in a thread; openenv 0.10 clients
have plain methods that return an awaitable when called from a running event loop and block otherwise;
hand-written clients are often plain synchronous objects. OpenEnv clients (either distribution) are called on
the shared loop and what they return is awaited (a ``SyncEnvClient`` is unwrapped to its async client);
anything else runs in worker threads, so one slow environment never stalls the other episodes. A stock client
class is built with the parameters its constructor accepts (``client_kwargs``), never more.

Sessions are pooled per rollout call (``EnvPool``): OpenEnv's ``reset()`` starts a fresh episode on an open
session, so an episode that ended cleanly hands its session to the next one instead of paying for a new
connection, a new server-side environment (for BrowserGym, a new browser) and a close. The pool also waits for
a server at capacity and checks that a server given by URL played the task it was asked for.

Every wait is bounded: connecting (``connect_timeout_s`` of a stock client, 10 s), each reset and step
(``request_timeout_s``: the eval's, but never below a stock client's own 60 s unless set explicitly with
``EvalOverrides``), building a client with ``env_factory`` (the same bound) and waiting for a free session on a
server at capacity (``CAPACITY_WAIT_S``).
"""

import asyncio
import inspect
import logging
import re
import time
from importlib import metadata
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigError

logger = logging.getLogger(__name__)

#: A stock OpenEnv client waits this long for each reply (``message_timeout_s``); ep_trl never bounds an
#: environment call tighter than the eval's own run would, so this is the floor of the default per-call bound.
STOCK_MESSAGE_TIMEOUT_S = 60.0
#: A stock OpenEnv client's connect timeout (``connect_timeout_s``).
STOCK_CONNECT_TIMEOUT_S = 10.0
#: How long an episode waits for a session on a server at capacity before it fails.
CAPACITY_WAIT_S = 300.0
#: How often a reset that failed in transport (connection refused or dropped) is retried on a fresh session.
TRANSPORT_RETRIES = 3
_CAPACITY = re.compile(r"at capacity: (\d+)/(\d+) sessions")


@dataclass(frozen=True)
class EnvSettings:
    """How to construct an episode's environment, as the eval's processor configures it (after overrides).

    ``task_urls`` maps each task to the URL of a server that plays only that task (servers ep_trl started
    with the eval's ``task_var`` set); sessions of a task then go to its server and ``reset`` names no task.
    """

    factory: Callable[[], Any] | None = None
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

    def describe(self) -> str:
        if self.factory is not None:
            return f"env_factory {getattr(self.factory, '__qualname__', self.factory)!r}"
        name = getattr(self.client_cls, "__name__", self.client_cls)
        if self.task_urls:
            return f"{name} on {len(self.task_urls)} local servers, one per task"
        return f"{name}(base_url={self.base_url!r})"

    def needs_launch(self) -> bool:
        """The eval names a Docker image or hub repo and no URL: a server must be started for it."""
        return (self.factory is None and self.client_cls is not None and not self.base_url and not self.task_urls
                and bool(self.docker_image or self.hub_repo_id))

    def url_for(self, task: str | None) -> str | None:
        return self.task_urls.get(task or "", self.base_url) if self.task_urls else self.base_url

    def check(self) -> None:
        """Fail at construction, not mid-training, when no environment can be built."""
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
            return  # ep_trl starts its server (ep_trl.env_servers), which fails clearly if it cannot
        if not self.base_url and not self.task_urls:
            source = (f"the Hugging Face hub ({self.hub_repo_id!r})" if self.hub_repo_id
                      else f"a Docker image ({self.docker_image!r})")
            raise ConfigError(
                f"The eval builds {self.client_cls.__name__} from {source} and ep_trl found no server to start for "
                "it. Start the environment server yourself and pass env_base_url='http://127.0.0.1:PORT', or pass "
                "provider=... (an OpenEnv runtime provider), or give the eval an env_factory."
            )
        if self.tasks and not self.task_var and not self.base_url:
            raise ConfigError("tasks are configured without task_var; set both (as OpenEnvRolloutProcessor requires).")


@dataclass(frozen=True)
class StepOutcome:
    """What one reset or step returned, normalised across client flavours."""

    observation: Any
    reward: float | None
    done: bool


#: The PyPI distributions that install the ``openenv`` package, and the ep_trl extra that installs each.
OPENENV_DISTRIBUTIONS = {"openenv": "openenv", "openenv-core": "openenv-core"}


def check_openenv() -> str:
    """Which OpenEnv distribution is installed (``"openenv 0.10.0"``), checked against ep_trl's supported ranges.

    Exactly one must be installed: both write the same ``openenv`` package, so with both one's files overwrite
    the other's. Neither is a hard dependency of ep_trl, so installing ep_trl never replaces the one a user has.
    """
    from .errors import VersionError
    from .versions import require_supported

    found = {}
    for distribution in OPENENV_DISTRIBUTIONS:
        try:
            found[distribution] = metadata.version(distribution)
        except metadata.PackageNotFoundError:
            continue
    if not found:
        raise VersionError("No OpenEnv is installed. Install one of its two distributions with ep_trl: "
                           "pip install 'ep-trl[openenv]' (openenv, the newest) or pip install 'ep-trl[openenv-core]' "
                           "(what OpenEnv's own environment packages depend on).")
    if len(found) > 1:
        raise VersionError(f"Both OpenEnv distributions are installed ({found}); they write the same openenv package, "
                           "so one's files overwrote the other's. Keep one: pip uninstall -y openenv openenv-core && "
                           "pip install 'ep-trl[openenv]' (or 'ep-trl[openenv-core]').")
    (distribution, version), = found.items()
    require_supported(distribution)
    return f"{distribution} {version}"


def _is_openenv_client(client: Any) -> bool:
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
    loop is running (and block otherwise): both are called on the loop and what they return is awaited. Any
    other client is synchronous and runs in a worker thread, so one slow environment never stalls the loop.
    ``label`` names the episode currently using it in errors; a pooled session is relabelled per episode.
    """

    def __init__(self, client: Any, timeout_s: float, label: str) -> None:
        self._client = client
        self._timeout_s = timeout_s
        self._on_loop = _is_openenv_client(client) or inspect.iscoroutinefunction(getattr(client, "reset", None))
        self.label = label
        #: The server this session belongs to (its URL; None for an env_factory client), for capacity accounting.
        self.server: str | None = None
        #: Not reset yet: a refusal then says something about the server, not about this session's history.
        self.fresh = True

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
        if self._on_loop:
            pending = _settle(fn(*args, **kwargs))
        else:
            pending = asyncio.to_thread(_call_sync, fn, args, kwargs)
        try:
            return await asyncio.wait_for(pending, timeout=self._timeout_s)
        except TimeoutError as exc:
            raise TimeoutError(
                f"environment {self.label}: {method}() did not answer within {self._timeout_s:g} s; if the "
                "environment is just slow, raise EvalOverrides(request_timeout_s=...)"
            ) from exc


async def _settle(result: Any) -> Any:
    """The value of a client call made on the loop: awaited if the client handed back an awaitable."""
    return await result if inspect.isawaitable(result) else result


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


def client_kwargs(settings: EnvSettings, base_url: str) -> dict[str, Any]:
    """What ``client_cls(...)`` is built with: the URL, and the eval's timeout and headers mapped onto the
    parameters this client accepts (a stock OpenEnv client takes ``message_timeout_s`` and, since 0.10,
    ``headers``; eval-protocol's own clients take ``request_timeout_s`` and ``default_headers``). Nothing the
    client does not accept is passed."""
    assert settings.client_cls is not None
    accepted = constructor_parameters(settings.client_cls)
    timeout = settings.request_timeout_s
    offered = {
        "message_timeout_s": timeout,
        "request_timeout_s": timeout,
        "connect_timeout_s": min(STOCK_CONNECT_TIMEOUT_S, timeout),
        "headers": dict(settings.default_headers) if settings.default_headers else None,
        "default_headers": dict(settings.default_headers) if settings.default_headers else None,
    }
    kwargs = {name: value for name, value in offered.items() if name in accepted and value is not None}
    kwargs["base_url"] = base_url
    return kwargs


async def open_env(settings: EnvSettings, label: str, task: str | None = None) -> EnvSession:
    """Build the environment client for one episode, as the eval's processor would."""
    timeout = settings.request_timeout_s
    if settings.factory is not None:
        building = asyncio.ensure_future(asyncio.to_thread(settings.factory))
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
        url = settings.url_for(task)
        assert url is not None
        client = settings.client_cls(**client_kwargs(settings, url))
    return EnvSession(_unwrap_sync_client(client), timeout_s=timeout, label=label)


async def _close_built(building: "asyncio.Future[Any]") -> None:
    """Close the client an ``env_factory`` built for an episode that no longer needs it."""
    if building.cancelled() or building.exception() is not None:
        return
    client = _unwrap_sync_client(building.result())
    await EnvSession(client, timeout_s=STOCK_CONNECT_TIMEOUT_S, label="abandoned by its episode").close()


def _close_orphan(building: "asyncio.Future[Any]") -> None:
    """Close a client whose construction finished after its episode stopped waiting for it."""
    task = asyncio.get_running_loop().create_task(_close_built(building))
    _closing.add(task)
    task.add_done_callback(_closing.discard)


_closing: set["asyncio.Task[None]"] = set()


def reset_kwargs(settings: EnvSettings, task: str | None) -> dict[str, Any]:
    """A server given by URL learns its task at reset (OpenEnv's BrowserGym takes ``task_name``); a server that
    ep_trl started for one task already plays it."""
    if task is None or settings.task_urls:
        return {}
    return {settings.reset_task_kwarg: task}


def is_transport_error(error: BaseException) -> bool:
    """A connection refused, reset or closed: safe to retry at reset, on a fresh session (never a timeout, which
    would only wait again, and never a step, which the server may have applied)."""
    if isinstance(error, TimeoutError):
        return False
    if isinstance(error, (ConnectionError, OSError)):
        return True
    try:
        from websockets.exceptions import ConnectionClosed
    except ImportError:
        return False
    return isinstance(error, ConnectionClosed)


def is_normal_close(error: BaseException) -> bool:
    """The server closed the WebSocket normally (code 1000): how an OpenEnv server turns a session away."""
    try:
        from websockets.exceptions import ConnectionClosedOK
    except ImportError:
        return False
    return isinstance(error, ConnectionClosedOK)


def capacity_of(error: BaseException) -> int | None:
    """The session limit an OpenEnv server reported when it refused a session (``CAPACITY_REACHED``)."""
    match = _CAPACITY.search(str(error))
    return int(match.group(2)) if match else None


def reported_task(observation: Any, key: str) -> str | None:
    """The task an observation says it belongs to (a ``key`` field, or ``metadata[key]``), if it says."""
    value = getattr(observation, key, None)
    if value is None and isinstance(getattr(observation, "metadata", None), Mapping):
        value = observation.metadata.get(key)
    return None if value is None else str(value)


@dataclass
class ServerNotes:
    """What a rollout function learned about its environment servers: sessions each admits (by URL), and which
    notices it already gave (each is said once per run)."""

    capacity: dict[str | None, int] = field(default_factory=dict)
    said: set[str] = field(default_factory=set)

    def say_once(self, key: str, message: str) -> None:
        if key not in self.said:
            self.said.add(key)
            logger.warning(message)


class EnvPool:
    """The environment sessions of one rollout call, reused across its episodes when ``reuse`` is on.

    Why reuse: TRL's own environment support constructs environments once and resets them often, and an OpenEnv
    ``reset()`` starts a new episode whatever the session did before. Reusing a session saves a connection, a
    server-side environment and a close per episode (on a loaded 2-core machine, a fresh session's first
    ``reset`` took 40-120 ms against ~7 ms on an open one: docs/benchmarks.md). A session whose episode
    failed is closed, never reused: its state is unknown. ``aclose()`` closes every session, so nothing outlives
    the call. ``reuse=False`` opens one session per episode, as eval-protocol's processor does: for environments
    whose constructor does per-episode work. A reset that fails in transport (connection refused or dropped) is
    retried on a fresh session, ``TRANSPORT_RETRIES`` times with backoff.

    Capacity: a stock OpenEnv server admits one session unless its app raises ``max_concurrent_envs``, and
    refuses more with ``CAPACITY_REACHED`` (or, racing the client's first message, by closing the connection
    while other sessions of ours are open). Such a refusal is not an episode failure: the episode waits until a
    session of that server is free (bounded by ``CAPACITY_WAIT_S``), and from then on no more sessions than the
    server admits are opened, so the call runs as many episodes at once as the server allows (said once).
    """

    def __init__(self, settings: EnvSettings, reuse: bool = True, notes: ServerNotes | None = None) -> None:
        self._settings = settings
        self._reuse = reuse
        self._notes = notes or ServerNotes()
        self._idle: dict[str | None, list[EnvSession]] = {}
        self._open: dict[str | None, int] = {}
        self._freed: asyncio.Condition | None = None
        #: Sessions opened during this call (a metric: without reuse, one per episode).
        self.opened = 0

    async def start(self, label: str, task: str | None) -> tuple[EnvSession, StepOutcome]:
        """A session for ``label`` playing ``task``, reset: an idle one of this call, else a new one."""
        url = self._settings.url_for(task)
        deadline = time.monotonic() + CAPACITY_WAIT_S
        attempt = 0
        while True:
            session = await self._session(url, label, task, deadline)
            others = self._open.get(url, 0) - 1
            try:
                outcome = await session.reset(**reset_kwargs(self._settings, task))
            except BaseException as exc:
                await self._close(session)  # also when the episode is cancelled: no session outlives the call
                if not isinstance(exc, Exception) or time.monotonic() > deadline:
                    raise
                limit = capacity_of(exc)
                # a stock server may also refuse a new session by closing it normally before the first reply
                refused = limit is not None or (session.fresh and is_normal_close(exc))
                if limit is None and refused and others >= 1:
                    limit = others
                if limit is not None:
                    self._learn_capacity(url, limit)
                if not refused and (not is_transport_error(exc) or attempt >= TRANSPORT_RETRIES):
                    raise
                attempt += 1
                logger.info("environment %s: %s at reset (%s); retrying on a fresh session (%d)", label,
                            "server refused the session" if refused else "connection failed", exc, attempt)
                await asyncio.sleep(min(0.05 * 2 ** attempt, 1.0))
                continue
            session.fresh = False
            problem = self._task_problem(outcome, task, url)
            if problem is not None:
                await self._close(session)
                raise RuntimeError(problem)
            return session, outcome

    async def release(self, session: EnvSession, reusable: bool) -> None:
        """Keep ``session`` for the next episode when it may be reused, else close it."""
        if self._reuse and reusable:
            self._idle.setdefault(session.server, []).append(session)
            await self._notify()
        else:
            await self._close(session)

    async def aclose(self) -> None:
        """Close every idle session (concurrently: closing is one round trip each)."""
        idle = [session for sessions in self._idle.values() for session in sessions]
        self._idle = {}
        await asyncio.gather(*(self._close(session) for session in idle))

    async def _session(self, url: str | None, label: str, task: str | None, deadline: float) -> EnvSession:
        if self._freed is None:
            self._freed = asyncio.Condition()
        async with self._freed:
            while not self._idle.get(url) and self._open.get(url, 0) >= self._notes.capacity.get(url, 1 << 30):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"environment {label}: the server at {url} stayed at capacity "
                                       f"({self._notes.capacity[url]} sessions) for {CAPACITY_WAIT_S:g} s")
                try:
                    await asyncio.wait_for(self._freed.wait(), remaining)
                except TimeoutError:
                    continue
            idle = self._idle.get(url)
            if idle:
                session = idle.pop()
                session.label = label
                return session
            self._open[url] = self._open.get(url, 0) + 1
        try:
            session = await open_env(self._settings, label, task)
        except BaseException:
            self._open[url] -= 1
            await self._notify()
            raise
        session.server = url
        self.opened += 1
        return session

    async def _close(self, session: EnvSession) -> None:
        await session.close()
        self._open[session.server] = self._open.get(session.server, 1) - 1
        await self._notify()

    async def _notify(self) -> None:
        if self._freed is not None:
            async with self._freed:
                self._freed.notify_all()

    def _learn_capacity(self, url: str | None, limit: int) -> None:
        if self._notes.capacity.get(url) != limit:
            self._notes.capacity[url] = limit
            self._notes.say_once(f"capacity {url}", (
                f"The environment server at {url} admits {limit} session(s) at a time (CAPACITY_REACHED); episodes "
                f"wait for a free session, so at most {limit} run at once on it. Raise the server's "
                "max_concurrent_envs (create_app(..., max_concurrent_envs=N)) to run more."))

    def _task_problem(self, outcome: StepOutcome, task: str | None, url: str | None) -> str | None:
        """Whether the server played ``task``: wrong is an error; unknowable is said once."""
        if task is None or self._settings.task_urls:
            return None
        key = self._settings.reset_task_kwarg
        played = reported_task(outcome.observation, key)
        if played is None:
            self._notes.say_once(f"unconfirmed {url}", (
                f"ep_trl asks the environment at {url or 'env_factory'} for each task with reset({key}=...), but its "
                f"observations do not report a {key!r}, so it cannot confirm the task was played. A server that "
                "picks its task from an environment variable at start plays the same task every time: start one "
                "server per task, or let ep_trl start them (no env_base_url, docs/migrating.md)."))
            return None
        if played != task:
            return (f"the environment at {url or 'env_factory'} played {played!r} when reset({key}={task!r}) asked "
                    f"for {task!r}: it does not select tasks at reset. Start one server per task (its task_var "
                    f"{self._settings.task_var!r} set), or let ep_trl start them (no env_base_url).")
        return None
