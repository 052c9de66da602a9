"""Blocking calls (synchronous environment clients, ``env_factory``, synchronous eval bodies) run off the event
loop, each in a pooled thread that runs nothing else meanwhile.

Why not asyncio's default executor: it is shared with everything else in the process and small (min(32, cpus + 4)
threads, 6 on a 2-core machine), and a call that timed out keeps its thread. A client whose ``step`` blocks
forever used it up: the first call returned after its timeout, the next one waited forever for a free thread.
Here a call never waits for a thread: it takes an idle pooled thread, or starts a new one when none is idle
(concurrency is already bounded by ``max_concurrent_rollouts``), so an abandoned call can never block the next
one. A pooled thread goes back to the idle ones when its call returns, and ends after ``IDLE_EXIT_S`` without work
(named ``IDLE_NAME`` meanwhile). A call still running past its timeout is abandoned, counted (``stuck_threads()``,
the ``ep_trl/stuck_threads`` metric) and named in the log, as is one still running when its task is cancelled (Ctrl-C,
a stream closed early); its thread is reused once the call returns.

Why reuse threads rather than start a thread per call: an empty call costs about 0.07 ms of CPU instead of about
0.2 ms on the benchmark machine, and a synchronous environment client pays it every step, a synchronous eval body
every episode (docs/benchmarks.md).
"""

import asyncio
import logging
import os
import queue
import threading
from collections.abc import Callable
from typing import TypeVar, cast

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: How long an idle pooled thread waits for a call before it ends (a training step's episodes keep theirs busy).
IDLE_EXIT_S = 10.0
#: The name of a pooled thread while it waits for a call (while it runs one: ``ep-trl <what the call is>``).
IDLE_NAME = "ep-trl idle pooled thread"

_Outcome = tuple[object, BaseException | None]


class _PooledThread:
    """A daemon thread that runs one call at a time, handed to it through its own queue."""

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue[tuple[Callable[[], object], str, Callable[[_Outcome], None]]] = queue.SimpleQueue()
        #: A token of the call it runs now, None while idle.
        self.running: object | None = None
        self.thread = threading.Thread(target=self._serve, name=IDLE_NAME, daemon=True)

    def _serve(self) -> None:
        while True:
            try:
                fn, what, finish = self.jobs.get(timeout=IDLE_EXIT_S)
            except queue.Empty:
                with _lock:
                    if self in _idle:  # nobody took it meanwhile: end
                        _idle.remove(self)
                        return
                continue  # taken just now: its call is on the way
            self.thread.name = f"ep-trl {what}"
            try:
                outcome: _Outcome = (fn(), None)
            except BaseException as exc:  # handed to the waiting coroutine, whatever it is
                outcome = (None, exc)
            self.thread.name = IDLE_NAME
            with _lock:  # idle before the caller hears back, so that its next call finds this thread
                _stuck.discard(self)
                self.running = None
                _idle.append(self)
            finish(outcome)
            del fn, finish, outcome  # hold nothing of the call while idle


_lock = threading.Lock()
_idle: list[_PooledThread] = []
_stuck: set[_PooledThread] = set()


def _forget_pool() -> None:
    """In a forked child the parent's pooled threads do not exist: start afresh."""
    global _lock
    _lock = threading.Lock()
    _idle.clear()
    _stuck.clear()


os.register_at_fork(after_in_child=_forget_pool)


def stuck_threads() -> int:
    """Threads still running a call that was abandoned at its timeout."""
    with _lock:
        return len(_stuck)


def _take_thread(call: object) -> _PooledThread:
    """An idle pooled thread, or a new one; marked as running ``call``."""
    with _lock:
        pooled = _idle.pop() if _idle else None
        if pooled is not None:
            pooled.running = call
    if pooled is None:
        pooled = _PooledThread()
        pooled.running = call
        pooled.thread.start()
    return pooled


async def run_blocking(fn: Callable[[], T], *, timeout_s: float, what: str) -> T:
    """``fn()`` in a pooled thread of its own, awaited for at most ``timeout_s`` (then ``TimeoutError``, the call is
    abandoned and counted until it returns; likewise when the awaiting task is cancelled)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: object, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(cast(T, result))  # what ``fn()`` returned

    def finish(outcome: _Outcome) -> None:
        try:
            loop.call_soon_threadsafe(settle, *outcome)
        except RuntimeError:  # the loop closed while this call was abandoned: nobody waits for the result
            logger.debug("%s returned after its event loop closed", what)

    call = object()
    pooled = _take_thread(call)
    pooled.jobs.put((fn, what, finish))
    try:
        async with asyncio.timeout(timeout_s):  # in this task: no task of its own per call (wait_for's)
            return await future
    except (TimeoutError, asyncio.CancelledError) as stopped:  # nobody waits for the call any more; it runs on
        with _lock:
            abandoned = pooled.running is call
            if abandoned:
                _stuck.add(pooled)
            count = len(_stuck)
        if abandoned and isinstance(stopped, TimeoutError):
            logger.warning(
                "%s is still running after %g s; its thread is abandoned (%d stuck in all)", what, timeout_s, count
            )
        elif abandoned:  # cancelled: the episode is being stopped on purpose (Ctrl-C, a stream closed early)
            logger.info(
                "%s is still running after its task was cancelled; its thread is abandoned (%d stuck in all)",
                what,
                count,
            )
        raise
