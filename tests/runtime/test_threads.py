"""ep_trl.runtime.threads: blocking calls in reused pooled threads that a stuck call can never hold up."""

import asyncio
import functools
import multiprocessing
import threading
import time

import pytest

from ep_trl.runtime import threads
from ep_trl.runtime.threads import run_blocking, stuck_threads


def _ident_and_name() -> tuple[int, str]:
    return threading.get_ident(), threading.current_thread().name


def test_calls_in_turn_reuse_one_pooled_thread_named_for_its_call() -> None:
    async def main() -> list[tuple[int, str]]:
        return [await run_blocking(_ident_and_name, timeout_s=5, what=f"call {k}") for k in range(5)]

    seen = asyncio.run(main())
    assert len({ident for ident, _ in seen}) == 1  # a fresh thread per call would give five
    assert [name for _, name in seen] == [f"ep-trl call {k}" for k in range(5)]
    assert threading.get_ident() not in {ident for ident, _ in seen}


def test_concurrent_calls_each_get_a_thread_and_results_and_errors_reach_their_callers() -> None:
    def slow(k: int) -> int:
        time.sleep(0.3)
        if k == 3:
            raise ValueError("three")
        return k

    async def main() -> list[object]:
        return await asyncio.gather(
            *(run_blocking(functools.partial(slow, k), timeout_s=10, what=f"slow {k}") for k in range(12)),
            return_exceptions=True,
        )

    started = time.perf_counter()
    results = asyncio.run(main())
    assert time.perf_counter() - started < 2.5  # 12 x 0.3 s one after another would be 3.6 s
    assert [r for k, r in enumerate(results) if k != 3] == [k for k in range(12) if k != 3]
    assert isinstance(results[3], ValueError) and str(results[3]) == "three"


async def _no_stuck_threads_within(seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while stuck_threads() and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    return stuck_threads() == 0


def test_a_stuck_call_is_counted_never_blocks_the_next_and_its_thread_returns_when_it_does() -> None:
    release = threading.Event()

    async def main() -> None:
        with pytest.raises(TimeoutError):
            await run_blocking(lambda: release.wait(10), timeout_s=0.2, what="stuck step")
        assert stuck_threads() == 1
        assert await run_blocking(lambda: 7, timeout_s=2, what="next step") == 7  # not held up by the stuck one
        release.set()
        assert await _no_stuck_threads_within(5)

    asyncio.run(main())


def test_idle_pooled_threads_wait_under_their_own_name_and_end(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(threads, "IDLE_EXIT_S", 1.0)

    def pause_then_ident_and_name() -> tuple[int, str]:
        time.sleep(0.1)
        return _ident_and_name()

    async def main() -> set[int]:
        return {
            ident
            for ident, _ in await asyncio.gather(
                *(run_blocking(pause_then_ident_and_name, timeout_s=5, what="w") for _ in range(3))
            )
        }

    used = asyncio.run(main())
    assert len(used) == 3
    names = [t.name for t in threading.enumerate() if t.ident in used]
    assert names == [threads.IDLE_NAME] * 3  # the leak check (tests/support/leaks.py) knows idle pooled threads by it
    deadline = time.monotonic() + 5
    while used & {t.ident for t in threading.enumerate()} and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not used & {t.ident for t in threading.enumerate()}


def _child_call(out: "multiprocessing.queues.Queue[int]") -> None:
    out.put(asyncio.run(run_blocking(lambda: 41 + 1, timeout_s=5, what="in the child")))


def test_a_forked_child_does_not_wait_on_its_parents_idle_threads() -> None:
    asyncio.run(run_blocking(lambda: None, timeout_s=5, what="leave an idle pooled thread"))
    assert threads._idle  # the parent has one to hand out; in the child that thread does not exist
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_child_call, args=(out,))
    child.start()
    try:
        assert out.get(timeout=20) == 42
    finally:
        child.join(10)
        if child.is_alive():
            child.kill()
    assert child.exitcode == 0


def test_a_call_whose_task_is_cancelled_is_counted_as_stuck_until_it_returns() -> None:
    """Issue 33: only a timed-out call was counted; one whose task was cancelled (Ctrl-C, a stream closed early) ran
    on in its thread uncounted."""
    release = threading.Event()

    async def main() -> None:
        call = asyncio.ensure_future(run_blocking(lambda: release.wait(10), timeout_s=60, what="cancelled step"))
        await asyncio.sleep(0.1)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        assert stuck_threads() == 1  # its thread still runs the call
        release.set()
        assert await _no_stuck_threads_within(5)

    asyncio.run(main())
