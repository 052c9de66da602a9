"""Blocking calls (synchronous environment clients, ``env_factory``, synchronous eval bodies) run off the event
loop, each in a thread of its own.

Why not asyncio's default executor: it is shared with everything else in the process and small (min(32, cpus + 4)
threads, 6 on a 2-core machine), and a call that timed out keeps its thread. A client whose ``step`` blocks
forever used it up: the first call returned after its timeout, the next one waited forever for a free thread.
Here every call gets a fresh daemon thread (the cost, ~0.1 ms, is nothing beside an environment round trip, and
concurrency is already bounded by ``max_concurrent_rollouts``), so an abandoned call can never block the next
one. A call still running past its timeout is abandoned, counted (``stuck_threads()``, the
``ep_trl/stuck_threads`` metric) and named in the log.
"""

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")

_stuck: set[threading.Thread] = set()
_lock = threading.Lock()


def stuck_threads() -> int:
    """Threads still running a call that was abandoned at its timeout."""
    with _lock:
        return len(_stuck)


async def run_blocking(fn: Callable[[], T], *, timeout_s: float, what: str) -> T:
    """``fn()`` in a thread of its own, awaited for at most ``timeout_s`` (then ``TimeoutError``, the thread is
    abandoned and counted until it returns)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def work() -> None:
        try:
            outcome: tuple[Any, BaseException | None] = (fn(), None)
        except BaseException as exc:  # handed to the waiting coroutine, whatever it is
            outcome = (None, exc)
        finally:
            with _lock:
                _stuck.discard(thread)
        try:
            loop.call_soon_threadsafe(settle, *outcome)
        except RuntimeError:  # the loop closed while this call was abandoned: nobody waits for the result
            logger.debug("%s returned after its event loop closed", what)

    thread = threading.Thread(target=work, name=f"ep-trl {what}", daemon=True)
    thread.start()
    try:
        return await asyncio.wait_for(future, timeout_s)
    except TimeoutError:
        if thread.is_alive():
            with _lock:
                _stuck.add(thread)
                count = len(_stuck)
            logger.warning("%s is still running after %g s; its thread is abandoned (%d stuck in all)", what,
                           timeout_s, count)
        raise

