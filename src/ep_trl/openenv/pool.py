"""The sessions of one rollout call: reused across its episodes, waiting for servers at capacity, retried when a
reset fails in transport, checked for playing the task they were asked for (see ``EnvPool``)."""

import asyncio
import logging
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..evalprotocol.spec import EnvSettings
from .client import EnvSession, Observation, StepOutcome, open_env

logger = logging.getLogger(__name__)

#: How long an episode waits for a session on a server at capacity before it fails.
CAPACITY_WAIT_S = 300.0
#: How often a reset that failed in transport (connection refused or dropped) is retried on a fresh session.
TRANSPORT_RETRIES = 3
#: How long a replica whose connection failed gets no new session while others are up (it may be starting again).
REPLICA_REST_S = 15.0
_CAPACITY = re.compile(r"at capacity: (\d+)/(\d+) sessions")


def reset_kwargs(
    settings: EnvSettings, task: str | None, seed: int | None = None, extra: Mapping[str, object] | None = None
) -> dict[str, object]:
    """A server given by URL learns its task at reset (OpenEnv's BrowserGym takes ``task_name``); a server that
    ep_trl started for one task already plays it. ``seed``: OpenEnv's ``reset(seed=...)``, when the run names one;
    ``extra``: more keyword arguments the run names (``EvalOverrides.reset_kwargs``)."""
    kwargs: dict[str, object] = {**(extra or {}), **({} if seed is None else {"seed": seed})}
    if task is None or settings.task_urls:
        return kwargs
    return {settings.reset_task_kwarg: task, **kwargs}


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


def reported_task(observation: Observation, key: str) -> str | None:
    """The task an observation says it belongs to (a ``key`` field, or ``metadata[key]``), if it says."""
    value = getattr(observation, key, None)
    metadata = getattr(observation, "metadata", None) if value is None else None
    if isinstance(metadata, Mapping):
        value = metadata.get(key)
    return None if value is None else str(value)


@dataclass
class ServerNotes:
    """What a rollout function learned about its environment servers: sessions each admits (by URL), and which
    notices it already gave (each is said once per run)."""

    capacity: dict[str | None, int] = field(default_factory=dict)
    said: set[str] = field(default_factory=set)
    #: Replicas whose connection failed, and until when (``time.monotonic()``) they get no new session.
    resting: dict[str, float] = field(default_factory=dict)

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

    async def start(
        self, label: str, task: str | None, seed: int | None = None, extra: Mapping[str, object] | None = None
    ) -> tuple[EnvSession, StepOutcome]:
        """A session for ``label`` playing ``task``, reset (with ``seed`` and the keyword arguments ``extra`` when
        given): an idle one of this call, else a new one."""
        deadline = time.monotonic() + CAPACITY_WAIT_S
        attempt = 0
        while True:
            # each try of a replicated environment goes to the replica with the fewest open, of those not resting
            url = self._replica() if self._settings.replica_urls else self._settings.url_for(task)
            session = await self._session(url, label, task, deadline)
            others = self._open.get(url, 0) - 1
            try:
                outcome = await session.reset(**reset_kwargs(self._settings, task, seed, extra))
            except BaseException as exc:
                # also when the episode is cancelled: no session outlives the call
                await self._close(session, cancelled=isinstance(exc, asyncio.CancelledError))
                if not isinstance(exc, Exception) or time.monotonic() > deadline:
                    raise
                limit = capacity_of(exc)
                # a stock server may also refuse a new session by closing it normally before the first reply
                refused = limit is not None or (session.fresh and is_normal_close(exc))
                if limit is None and refused and others >= 1:
                    limit = others
                if limit is not None:
                    self._learn_capacity(url, limit)
                if not refused and url in self._settings.replica_urls and is_transport_error(exc):
                    self._notes.resting[url] = time.monotonic() + REPLICA_REST_S
                if not refused and (not is_transport_error(exc) or attempt >= TRANSPORT_RETRIES):
                    raise
                attempt += 1
                logger.info(
                    "environment %s: %s at reset (%s); retrying on a fresh session (%d)",
                    label,
                    "server refused the session" if refused else "connection failed",
                    exc,
                    attempt,
                )
                await asyncio.sleep(min(0.05 * 2**attempt, 1.0))
                continue
            session.fresh = False
            problem = self._task_problem(outcome, task, url)
            if problem is not None:
                await self._close(session)
                raise RuntimeError(problem)
            return session, outcome

    async def release(self, session: EnvSession, reusable: bool, cancelled: bool = False) -> None:
        """Keep ``session`` for the next episode when it may be reused, else close it (not waiting long for the
        server when its episode was ``cancelled``)."""
        if self._reuse and reusable:
            self._idle.setdefault(session.server, []).append(session)
            await self._notify()
        else:
            await self._close(session, cancelled)

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
                    raise TimeoutError(
                        f"environment {label}: {self._server(url)} stayed at capacity "
                        f"({self._notes.capacity[url]} sessions) for {CAPACITY_WAIT_S:g} s"
                    )
                try:  # in this task, not wait_for's: a cancelled wait gets the lock back before it leaves
                    async with asyncio.timeout(remaining):
                        await self._freed.wait()
                except TimeoutError:
                    continue
            idle = self._idle.get(url)
            if idle:
                session = idle.pop()
                session.label = label
                return session
            self._open[url] = self._open.get(url, 0) + 1
        try:
            session = await open_env(self._settings, label, task, url)
        except BaseException:
            self._open[url] -= 1
            await self._notify()
            raise
        session.server = url
        self.opened += 1
        return session

    def _replica(self) -> str:
        """The replica the next session goes to: one with an idle session of this call, else the one with the fewest
        sessions open (the first of them, in the order given); a replica whose connection failed in the last
        ``REPLICA_REST_S`` only when every replica's did."""
        now = time.monotonic()
        up = [url for url in self._settings.replica_urls if self._notes.resting.get(url, 0.0) <= now]
        return min(up or self._settings.replica_urls, key=lambda url: (not self._idle.get(url), self._open.get(url, 0)))

    async def _close(self, session: EnvSession, cancelled: bool = False) -> None:
        await session.close(cancelled)
        self._open[session.server] = self._open.get(session.server, 1) - 1
        await self._notify()

    async def _notify(self) -> None:
        if self._freed is not None:
            async with self._freed:
                self._freed.notify_all()

    def _server(self, url: str | None) -> str:
        """The server in a message: its URL, or the ``env_factory`` whose clients reach it."""
        if url is not None:
            return f"the environment server at {url}"
        factory = self._settings.factory
        name = getattr(factory, "__qualname__", None) or type(factory).__name__
        return f"the environment server behind env_factory {getattr(factory, '__module__', '?')}.{name}"

    def _learn_capacity(self, url: str | None, limit: int) -> None:
        if self._notes.capacity.get(url) != limit:
            self._notes.capacity[url] = limit
            server = self._server(url)
            self._notes.say_once(
                f"capacity {url}",
                (
                    f"{server[0].upper()}{server[1:]} admits {limit} session(s) at a time (CAPACITY_REACHED); episodes "
                    f"wait for a free session, so at most {limit} run at once on it. Raise the server's "
                    "max_concurrent_envs (create_app(..., max_concurrent_envs=N)) to run more."
                ),
            )

    def _task_problem(self, outcome: StepOutcome, task: str | None, url: str | None) -> str | None:
        """Whether the server played ``task``: wrong is an error; unknowable is said once."""
        if task is None or self._settings.task_urls:
            return None
        key = self._settings.reset_task_kwarg
        played = reported_task(outcome.observation, key)
        if played is None:
            self._notes.say_once(
                f"unconfirmed {url}",
                (
                    f"ep_trl asks the environment at {url or 'env_factory'} for each task with reset({key}=...), but "
                    "its "
                    f"observations do not report a {key!r}, so it cannot confirm the task was played. A server that "
                    "picks its task from an environment variable at start plays the same task every time: start one "
                    "server per task, or let ep_trl start them (no env_base_url, docs/migrating.md)."
                ),
            )
            return None
        if played != task:
            return (
                f"the environment at {url or 'env_factory'} played {played!r} when reset({key}={task!r}) asked "
                f"for {task!r}: it does not select tasks at reset. Start one server per task (its task_var "
                f"{self._settings.task_var!r} set), or let ep_trl start them (no env_base_url)."
            )
        return None
