"""The queue of turns waiting for an in-process model and the one thread that serves them in batches, shared by
the backends that call a model in the trainer's own process (``trainer``, ``colocate``).

A model call there blocks and must not run twice at once, so one model thread makes every call, off the event
loop: environment steps, tool calls and scoring go on meanwhile. Turns that arrive while the thread is busy (or
within a batch window of the first) are served together, in one call per batch.
"""

import asyncio
import contextlib
import logging
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Generic, TypeVar

Request = TypeVar("Request")
Result = TypeVar("Result")
T = TypeVar("T")

logger = logging.getLogger(__name__)


@dataclass
class _Waiting(Generic[Request]):
    """One submitted request and the future its submitter awaits."""

    request: Request
    future: asyncio.Future


class BatchQueue(Generic[Request, Result]):
    """Requests waiting for a model, and the model thread that runs them in batches of at most ``max_batch_size``.

    ``run_batch(requests)`` runs on the model thread and returns one outcome per request, in order: the request's
    result, or an exception, which fails that request alone. ``window_s``: how long the batch waits after its first
    request for others to join (0: it takes only what already queued). ``batch_key``: requests with different keys
    never share a call (a batch holding several keys runs as one call per key, in the order they arrived).
    ``batch_error(exc, n)``: what the ``n`` waiters of a call that raised ``exc`` receive (default ``exc`` itself);
    the next batch runs anew. ``thread_name`` prefixes the model thread's name, ``task_name`` names the asyncio task
    that forms the batches.
    """

    def __init__(
        self,
        run_batch: Callable[[list[Request]], Sequence[Result | BaseException]],
        *,
        max_batch_size: int,
        thread_name: str,
        task_name: str,
        window_s: float = 0.0,
        batch_key: Callable[[Request], Hashable] | None = None,
        batch_error: Callable[[Exception, int], BaseException] | None = None,
    ) -> None:
        self._run_batch = run_batch
        self._max_batch = max_batch_size
        self._window_s = window_s
        self._key = batch_key
        self._batch_error = batch_error
        self._task_name = task_name
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=thread_name)
        self._queue: asyncio.Queue[_Waiting[Request]] | None = None
        self._task: asyncio.Task | None = None

    async def submit(self, request: Request) -> Result:
        """Queue ``request`` for the next batch and wait for its result (or its error, raised). A batching task that
        ended (cancelled with its loop's tasks, or broken) has handed its error to every request it held; a fresh
        one serves from here on."""
        loop = asyncio.get_running_loop()
        if self._queue is None or self._task is None or self._task.done():
            self._queue = asyncio.Queue()
            self._task = loop.create_task(self._serve(self._queue), name=self._task_name)
        waiting = _Waiting(request, loop.create_future())
        self._queue.put_nowait(waiting)
        return await waiting.future

    async def call(self, fn: Callable[[], T]) -> T:
        """``fn()`` on the model thread, after the model calls already handed to it (what else must touch the model
        from that thread alone)."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    async def aclose(self) -> None:
        """End the batching task (cancelled, then awaited until it has unwound), then the model thread, waiting for a
        call in progress to return."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):  # the cancellation asked for just above
                await self._task
            self._task = None
        self._executor.shutdown(wait=True)

    async def _serve(self, queue: "asyncio.Queue[_Waiting[Request]]") -> None:
        held: list[_Waiting[Request]] = []  # the batch taken off the queue, until each of its requests is settled
        try:
            await self._serve_batches(queue, held)
        except Exception as exc:  # a batch's own code broke (batch_key, batch_error): no request may wait forever
            logger.error("%s ended: %s: %s", self._task_name, type(exc).__name__, exc, exc_info=True)
            _settle_all(queue, held, exc)
        except BaseException:  # cancelled (with its loop's other tasks) or interrupted
            _settle_all(queue, held, RuntimeError(f"{self._task_name} was stopped before this request was served"))
            raise

    async def _serve_batches(self, queue: "asyncio.Queue[_Waiting[Request]]", batch: list[_Waiting[Request]]) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch.clear()
            batch.append(await queue.get())
            if self._window_s > 0:
                await asyncio.sleep(self._window_s)  # let the requests of concurrent episodes join
            while not queue.empty() and len(batch) < self._max_batch:
                batch.append(queue.get_nowait())
            for group in self._groups(batch):
                live = [w for w in group if not w.future.done()]  # a submitter cancelled meanwhile waits no more
                if not live:
                    continue
                try:
                    outcomes = await loop.run_in_executor(self._executor, self._run_batch, [w.request for w in live])
                except Exception as exc:  # handed to every waiter of this call; each reports it
                    error = self._batch_error(exc, len(live)) if self._batch_error is not None else exc
                    for w in live:
                        _settle(w.future, error)
                    continue
                for w, outcome in zip(live, outcomes):
                    _settle(w.future, outcome)

    def _groups(self, batch: list[_Waiting[Request]]) -> list[list[_Waiting[Request]]]:
        if self._key is None:
            return [batch]
        groups: dict[Hashable, list[_Waiting[Request]]] = {}
        for waiting in batch:
            groups.setdefault(self._key(waiting.request), []).append(waiting)
        return list(groups.values())


def _settle_all(queue: "asyncio.Queue[_Waiting[Request]]", held: list[_Waiting[Request]], error: BaseException) -> None:
    """Hand ``error`` to every request the batching task held or had queued: it serves them no more."""
    while not queue.empty():
        held.append(queue.get_nowait())
    for waiting in held:
        _settle(waiting.future, error)


def _settle(future: asyncio.Future, outcome: object) -> None:
    """Hand ``outcome`` to ``future`` (raised if it is an exception), unless its submitter stopped waiting."""
    if future.done():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
