"""The shared pieces of the in-process backends: the batch queue that serves turns from one worker thread, and the
first fatal error that fails the rest of a rollout call."""

import asyncio
import threading
from typing import TYPE_CHECKING, TypeVar

import pytest

from ep_trl.errors import GenerationError
from ep_trl.generation import CallFailure
from ep_trl.generation.batching import BatchQueue

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

T = TypeVar("T")


class Model:
    """A stand-in model call: records each batch and the thread it ran on; ``"boom"`` makes the whole call raise,
    ``"bad"`` fails its own request."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.threads: set[str] = set()
        self.release = threading.Event()
        self.release.set()

    def __call__(self, requests: list[str]) -> list[object]:
        self.release.wait(5)
        self.batches.append(list(requests))
        self.threads.add(threading.current_thread().name)
        if "boom" in requests:
            raise RuntimeError("the model broke")
        return [ValueError(f"{r} is bad") if r == "bad" else r.upper() for r in requests]


def serve(queue: "BatchQueue[str, object]", main: "Callable[[], Awaitable[T]]") -> T:
    async def run() -> T:
        try:
            return await main()
        finally:
            await queue.aclose()

    return asyncio.run(run())


def test_requests_that_queue_while_the_thread_is_busy_form_one_batch_and_each_gets_its_own_result() -> None:
    model = Model()
    queue = BatchQueue(model, max_batch_size=3, thread_name="test-batch", task_name="test-batches")

    async def main() -> tuple[object, list[object]]:
        model.release.clear()  # the first request holds the thread while the others queue up
        first = asyncio.ensure_future(queue.submit("a"))
        await asyncio.sleep(0.05)
        rest = asyncio.gather(*(queue.submit(r) for r in "bcdef"))
        await asyncio.sleep(0.05)
        model.release.set()
        return await first, await rest

    first, rest = serve(queue, main)
    assert first == "A" and rest == ["B", "C", "D", "E", "F"]
    assert model.batches == [["a"], ["b", "c", "d"], ["e", "f"]]  # at most max_batch_size per call, in order
    assert len(model.threads) == 1 and next(iter(model.threads)).startswith("test-batch")


def test_the_batch_window_lets_later_requests_join_the_first() -> None:
    model = Model()
    queue = BatchQueue(model, max_batch_size=8, window_s=0.2, thread_name="test-batch", task_name="test-batches")

    async def main() -> list[object]:
        first = asyncio.ensure_future(queue.submit("a"))
        await asyncio.sleep(0.05)
        later = asyncio.gather(queue.submit("b"), queue.submit("c"))
        return [await first, *await later]

    assert serve(queue, main) == ["A", "B", "C"]
    assert model.batches == [["a", "b", "c"]]


def test_requests_with_different_keys_never_share_a_call() -> None:
    model = Model()
    queue = BatchQueue(
        model, max_batch_size=8, window_s=0.1, batch_key=len, thread_name="test-batch", task_name="test-batches"
    )

    async def main() -> list[object]:
        return await asyncio.gather(*(queue.submit(r) for r in ("a", "bb", "c", "dd", "eee")))

    assert serve(queue, main) == ["A", "BB", "C", "DD", "EEE"]
    assert model.batches == [["a", "c"], ["bb", "dd"], ["eee"]]  # one call per key, in the order keys arrived


def test_an_error_outcome_fails_its_request_alone() -> None:
    model = Model()
    queue = BatchQueue(model, max_batch_size=8, window_s=0.1, thread_name="test-batch", task_name="test-batches")

    async def main() -> tuple[object, object, object]:
        return await asyncio.gather(queue.submit("a"), queue.submit("bad"), queue.submit("c"), return_exceptions=True)

    a, bad, c = serve(queue, main)
    assert (a, c) == ("A", "C") and isinstance(bad, ValueError) and str(bad) == "bad is bad"
    assert model.batches == [["a", "bad", "c"]]


def test_a_call_that_raises_fails_only_its_batch_and_the_next_batch_runs_anew() -> None:
    model = Model()
    queue = BatchQueue(
        model,
        max_batch_size=8,
        window_s=0.1,
        batch_key=lambda r: r == "x",
        thread_name="test-batch",
        task_name="test-batches",
        batch_error=lambda exc, n: GenerationError(f"a batch of {n} failed: {exc}"),
    )

    async def main() -> tuple[tuple[object, object, object], object]:
        failed = await asyncio.gather(
            queue.submit("boom"), queue.submit("a"), queue.submit("x"), return_exceptions=True
        )
        return failed, await queue.submit("b")

    (boom, a, x), after = serve(queue, main)
    assert isinstance(boom, GenerationError) and boom is a and str(boom) == "a batch of 2 failed: the model broke"
    assert x == "X" and after == "B"  # the other key's call and the next batch are not touched


def test_without_batch_error_the_waiters_get_the_exception_itself() -> None:
    model = Model()
    queue = BatchQueue(model, max_batch_size=8, thread_name="test-batch", task_name="test-batches")

    with pytest.raises(RuntimeError, match="the model broke"):
        serve(queue, lambda: queue.submit("boom"))


def test_a_cancelled_request_is_left_out_of_the_call() -> None:
    model = Model()
    queue = BatchQueue(model, max_batch_size=8, thread_name="test-batch", task_name="test-batches")

    async def main() -> tuple[object, object]:
        model.release.clear()
        first = asyncio.ensure_future(queue.submit("a"))
        await asyncio.sleep(0.05)
        gone = asyncio.ensure_future(queue.submit("gone"))
        kept = asyncio.ensure_future(queue.submit("kept"))
        await asyncio.sleep(0.05)
        gone.cancel()
        model.release.set()
        return await first, await kept

    assert serve(queue, main) == ("A", "KEPT")
    assert model.batches == [["a"], ["kept"]]


def test_the_waiters_of_a_batching_task_that_died_get_its_error_and_a_fresh_task_serves_the_next() -> None:
    """Issue 33: a batching task that died (here its batch_key raised) left every request it held or had queued
    waiting forever, and the next submit started a fresh queue beside them."""
    model = Model()

    def key(request: str) -> str:
        if request == "unkeyable":
            raise KeyError(request)
        return "same"

    queue = BatchQueue(model, max_batch_size=2, batch_key=key, thread_name="test-batch", task_name="test-batches")

    async def main() -> tuple[object, list[BaseException | str | None], object]:
        model.release.clear()  # "a" holds the thread while the others queue behind it
        first = asyncio.ensure_future(queue.submit("a"))
        await asyncio.sleep(0.05)
        stranded = [asyncio.ensure_future(queue.submit(r)) for r in ("unkeyable", "b", "c")]  # "c" still queued
        await asyncio.sleep(0.05)
        model.release.set()
        done, pending = await asyncio.wait(stranded, timeout=5)
        for task in pending:
            task.cancel()
        return await first, [t.exception() if t in done else "waited" for t in stranded], await queue.submit("d")

    first, stranded, after = serve(queue, main)
    assert first == "A" and after == "D"
    assert [type(e).__name__ for e in stranded] == ["KeyError"] * 3, stranded


def test_requests_queued_when_the_queue_closes_get_an_error() -> None:
    model = Model()
    queue = BatchQueue(model, max_batch_size=1, thread_name="test-batch", task_name="test-batches")

    async def main() -> tuple[object, object]:
        model.release.clear()
        first = asyncio.ensure_future(queue.submit("a"))
        await asyncio.sleep(0.05)
        queued = asyncio.ensure_future(queue.submit("b"))
        await asyncio.sleep(0.05)
        threading.Timer(0.3, model.release.set).start()  # "a"'s call returns while aclose waits for the thread
        await queue.aclose()
        return await asyncio.wait_for(asyncio.gather(first, queued, return_exceptions=True), 5)

    first, queued = asyncio.run(main())
    assert isinstance(first, RuntimeError) and isinstance(queued, RuntimeError), (first, queued)
    assert "test-batches was stopped before this request was served" in str(queued)


def test_call_runs_on_the_worker_thread() -> None:
    model = Model()
    queue = BatchQueue(model, max_batch_size=8, thread_name="test-batch", task_name="test-batches")

    async def main() -> str:
        await queue.submit("a")
        return await queue.call(lambda: threading.current_thread().name)

    assert {serve(queue, main)} == model.threads


def test_the_first_fatal_error_sticks_until_reset() -> None:
    failure = CallFailure("not sent: an earlier request already failed for good")
    with failure.guard("turn 1"):
        pass
    assert failure.error is None
    first = GenerationError("the server is gone")
    with pytest.raises(GenerationError) as raised, failure.guard("turn 2"):
        raise first
    assert raised.value is first and failure.error is first
    with (
        pytest.raises(
            GenerationError, match="^turn 3 not sent: an earlier request already failed for good: the server is gone$"
        ),
        failure.guard("turn 3"),
    ):
        raise AssertionError("a refused turn does not run")
    assert failure.error is first  # the refusal does not replace the first error
    failure.reset()
    with failure.guard("turn 4"):
        pass
    assert failure.error is None


def test_spared_errors_and_other_exceptions_fail_their_turn_alone() -> None:
    class Rejected(GenerationError):
        pass

    failure = CallFailure("not generated", spared=(Rejected,))
    with pytest.raises(Rejected), failure.guard("turn 1"):
        raise Rejected("this prompt is too long")
    with pytest.raises(ValueError), failure.guard("turn 2"):
        raise ValueError("not a generation error")
    assert failure.error is None
