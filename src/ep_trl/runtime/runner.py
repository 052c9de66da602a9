"""One persistent event loop, in a background thread, shared by every rollout call.

TRL calls ``rollout_func`` synchronously from its training loop. Creating a new event loop per call (as
eval-protocol's own bridge does) throws away connection pools and breaks objects bound to a loop, such as
async environment clients. A single daemon thread owns one loop for the lifetime of the rollout function;
the trainer thread submits a coroutine and blocks on its result.
"""

import asyncio
import concurrent.futures
import logging
import os
import threading
from collections.abc import Coroutine
from typing import TypeVar

from . import shutdown

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: How long an interrupted call may take to cancel its episodes and close their environment sessions.
CANCEL_WAIT_S = 30.0


class LoopRunner:
    """Runs coroutines on a private, long-lived event loop in a daemon thread."""

    def __init__(self, name: str = "ep-trl-rollouts") -> None:
        self._name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._pid = os.getpid()  # whose loop it is: a forked child has no thread running its parent's
        self._closed = False

    def _forget_parents_loop(self) -> None:
        """In a forked child: the loop is its parent's, run by a thread the child does not have; start afresh."""
        if self._pid != os.getpid():
            self._lock = threading.Lock()
            self._loop = self._thread = None
            self._pid = os.getpid()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The loop, started on first use; after ``close()`` a fresh one, unless ep_trl has closed for the process's
        exit (then ``ProcessExitingError``)."""
        self._forget_parents_loop()
        with self._lock:
            if self._loop is None or self._thread is None or not self._thread.is_alive():
                if self._closed:
                    shutdown.refuse_if_closed()
                loop = asyncio.new_event_loop()
                ready = threading.Event()

                def _serve() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(ready.set)
                    loop.run_forever()

                thread = threading.Thread(target=_serve, name=self._name, daemon=True)
                thread.start()
                ready.wait()
                self._loop, self._thread = loop, thread
            return self._loop

    def run(self, coro: Coroutine[object, object, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop and wait for its result from the calling (non-loop) thread.

        If the wait is interrupted (Ctrl-C, a timeout), ``coro`` is cancelled and given up to
        ``CANCEL_WAIT_S`` to finish its cleanup (closing environment sessions, settling its tasks) before the
        interruption propagates, so nothing is left pending when the interpreter exits."""
        loop = self.loop
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("LoopRunner.run() was called from its own loop thread; await the coroutine instead.")
        finished = threading.Event()

        async def tracked() -> T:
            try:
                return await coro
            finally:
                finished.set()

        future = asyncio.run_coroutine_threadsafe(tracked(), loop)
        try:
            return future.result(timeout)
        except BaseException:
            future.cancel()
            if not finished.wait(CANCEL_WAIT_S):
                logger.warning("an interrupted rollout call did not finish its cleanup within %.0f s", CANCEL_WAIT_S)
            raise

    def cancel_pending(self) -> None:
        """Cancel every task on the loop (a call still in flight, from another thread) and wait until they ended."""
        self._forget_parents_loop()
        with self._lock:
            loop = self._loop
        if loop is None or not loop.is_running():
            return
        try:
            asyncio.run_coroutine_threadsafe(_cancel_pending(), loop).result(timeout=CANCEL_WAIT_S)
        except (TimeoutError, concurrent.futures.TimeoutError):
            logger.warning("tasks on the ep_trl loop did not end within %.0f s of being cancelled", CANCEL_WAIT_S)

    def close(self) -> None:
        """Stop the loop and join its thread; a later ``run`` starts a fresh one (unless ep_trl has closed for the
        process's exit). In a forked child there is nothing to stop: the loop is the parent's."""
        self._forget_parents_loop()
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
            self._closed = True
        if loop is None or thread is None:
            return
        try:  # libraries start background tasks on the loop they run on (litellm's logging worker): end them first
            asyncio.run_coroutine_threadsafe(_cancel_pending(), loop).result(timeout=CANCEL_WAIT_S)
        except (TimeoutError, concurrent.futures.TimeoutError):
            logger.warning(
                "background tasks on the ep_trl loop did not end within %.0f s of being cancelled", CANCEL_WAIT_S
            )
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        if thread.is_alive():
            logger.warning("ep_trl loop thread %s did not stop within 10 s", self._name)
            return
        loop.close()


async def _cancel_pending() -> None:
    """Cancel every other task on the running loop and wait until they have ended."""
    current = asyncio.current_task()
    pending = [task for task in asyncio.all_tasks() if task is not current]
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
