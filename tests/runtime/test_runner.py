"""ep_trl.runtime.runner: the rollout function's one event loop, in a thread of its own."""

import asyncio
import multiprocessing
import time

from ep_trl.runtime.runner import LoopRunner


async def _answer() -> int:
    await asyncio.sleep(0)
    return 42


def _close_and_run_in_child(runner: LoopRunner, out: "multiprocessing.queues.Queue[tuple[int, float]]") -> None:
    started = time.monotonic()
    runner.cancel_pending()  # what RolloutFunction.close does first
    runner.close()
    out.put((runner.run(_answer()), time.monotonic() - started))


def test_a_forked_child_neither_waits_on_nor_stops_its_parents_loop() -> None:
    """Issue 33: in a forked child the parent's loop looks running but no thread runs it, and closing it waited 30 s
    (then failed); the child's runner starts a loop of its own, and the parent's goes on."""
    runner = LoopRunner()
    try:
        assert runner.run(_answer()) == 42  # the parent's loop is running
        ctx = multiprocessing.get_context("fork")
        out = ctx.Queue()
        child = ctx.Process(target=_close_and_run_in_child, args=(runner, out))
        child.start()
        try:
            answer, seconds = out.get(timeout=20)
        finally:
            child.join(10)
            if child.is_alive():
                child.kill()
        assert answer == 42 and seconds < 5 and child.exitcode == 0
        assert runner.run(_answer()) == 42  # the parent's loop is untouched
    finally:
        runner.close()
