"""The rollout log writer on its own: collapsing updates, surviving bad rows, the token view, live events."""

import functools
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from eval_protocol.event_bus.sqlite_event_bus_database import SqliteEventBusDatabase

from ep_trl import evalprotocol
from ep_trl.evalprotocol import StoreLogger
from ep_trl.traininglog.writer import RolloutLogWriter, token_view
from ep_trl.trajectory.tokens import Trajectory

if TYPE_CHECKING:
    from collections.abc import Callable

    from ep_trl.trajectory.types import Row


def make_row(rollout_id: str, step_rewards: list[float]) -> "Row":
    return evalprotocol.build_row(
        messages=[{"role": "user", "content": "hi"}],
        eval_name="test_x",
        row_id="prompt-1",
        rollout_id=rollout_id,
        invocation_id="inv",
        experiment_id="inv-step0",
        run_id="step-0",
        completion_params={"model": "m"},
        extra={"step_rewards": step_rewards},
    )


def test_queued_updates_collapse_to_the_newest_and_a_bad_row_is_only_counted(tmp_path: Path) -> None:
    store = StoreLogger(tmp_path / "logs.db")
    writer = RolloutLogWriter(store, min_interval_s=5.0)
    built: list[str] = []

    def update(rollout_id: str, rewards: list[float]) -> "Callable[[], Row]":
        def build() -> "Row":
            built.append(f"{rollout_id}{rewards}")
            return make_row(rollout_id, rewards)

        return build

    def broken() -> None:
        raise ValueError("cannot build")

    try:
        writer.log("r1", update("r1", []))  # the writer now waits 5 s for more updates before it writes
        for rewards in ([0.1], [0.1, 0.2], [0.1, 0.2, 0.3]):
            writer.log("r2", update("r2", rewards))
        writer.log("r3", broken)
        started = time.monotonic()
        writer.flush()
        assert time.monotonic() - started < 2.0  # flush cuts the wait short
        assert writer.written == 2
        writer.log("r4", update("r4", [1.0]))
    finally:
        writer.close()
    assert built == ["r1[]", "r2[0.1, 0.2, 0.3]", "r4[1.0]"]  # r2's older updates were never built
    assert (writer.queued, writer.written, writer.failures) == (6, 3, 1)
    stored = {r.execution_metadata.rollout_id: r.execution_metadata.extra["step_rewards"] for r in store.read()}
    assert stored == {"r1": [], "r2": [0.1, 0.2, 0.3], "r4": [1.0]}
    # each written row is also announced in the same file, which is what a live `HOME=<dir> ep logs` listens to
    events = SqliteEventBusDatabase(str(tmp_path / "logs.db")).get_unprocessed_events("ep-logs")
    assert sorted(e["data"]["execution_metadata"]["rollout_id"] for e in events) == ["r1", "r2", "r4"]


def test_rows_still_queued_at_interpreter_exit_are_written(tmp_path: Path) -> None:
    # a training script seldom closes its rollout function; its last rows must not die with the writer thread
    script = (
        "from ep_trl.evalprotocol import StoreLogger\nfrom ep_trl.traininglog.writer import RolloutLogWriter\n"
        "from tests.traininglog.test_writer import make_row\n"
        f"writer = RolloutLogWriter(StoreLogger({str(tmp_path / 'logs.db')!r}), min_interval_s=60)\n"
        "writer.log('last', lambda: make_row('last', [1.0]))\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120, cwd=Path(__file__).resolve().parents[2])
    rows = StoreLogger(tmp_path / "logs.db").read()
    assert [r.execution_metadata.rollout_id for r in rows] == ["last"]


class KillsTheWriterThread(BaseException):
    """Fault injection: what the writer thread does not expect (it catches ``Exception`` only), so it dies of it."""


def test_rows_queued_after_the_writer_thread_died_are_written_by_flush_in_the_owning_process_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 40: flush() returned at once when the writer thread had died, and the queued rows were never written."""
    died: list[type] = []
    monkeypatch.setattr(threading, "excepthook", lambda hook: died.append(hook.exc_type))  # the thread's death, seen
    store = StoreLogger(tmp_path / "logs.db")
    writer = RolloutLogWriter(store, min_interval_s=0.0)

    def kill() -> None:
        raise KillsTheWriterThread()

    try:
        writer.log("kills-the-thread", kill)
        writer._thread.join(10)
        assert died == [KillsTheWriterThread] and not writer._thread.is_alive()
        for rollout_id in ("r1", "r2"):
            writer.log(rollout_id, functools.partial(make_row, rollout_id, [1.0]))
        child = os.fork()
        if child == 0:  # a forked child's copy: the rows are its parent's to write
            writer.flush()
            os._exit(0)
        assert os.waitpid(child, 0)[1] == 0
        assert store.read() == []
        writer.flush()
        assert sorted(r.execution_metadata.rollout_id for r in store.read()) == ["r1", "r2"]
        assert (writer.queued, writer.written, writer.failures) == (3, 2, 1)  # the row it died on: counted
        assert "the rollout log writer thread has ended" in caplog.text and "writing the 2 row updates" in caplog.text
        writer.log("r3", lambda: make_row("r3", [2.0]))
    finally:
        writer.close()  # writes r3 the same way
    assert sorted(r.execution_metadata.rollout_id for r in store.read()) == ["r1", "r2", "r3"]


def test_a_flush_waiting_when_the_writer_thread_dies_writes_the_rows_itself_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    died: list[type] = []
    monkeypatch.setattr(threading, "excepthook", lambda hook: died.append(hook.exc_type))
    store = StoreLogger(tmp_path / "logs.db")
    writer = RolloutLogWriter(store, min_interval_s=0.0)
    building, release = threading.Event(), threading.Event()

    def kill_when_released() -> None:
        building.set()
        release.wait(10)
        raise KillsTheWriterThread()

    try:
        writer.log("kills-the-thread", kill_when_released)
        assert building.wait(10)  # the thread holds that update alone; the next ones stay queued
        writer.log("r1", lambda: make_row("r1", [1.0]))
        threading.Timer(0.3, release.set).start()
        started = time.monotonic()
        writer.flush(timeout_s=30)
        assert time.monotonic() - started < 5  # not the 30 s timeout: it saw the thread die
        assert died == [KillsTheWriterThread]
        assert [r.execution_metadata.rollout_id for r in store.read()] == ["r1"]
    finally:
        writer.close()


def test_a_writer_thread_that_dies_mid_batch_leaves_the_rest_of_the_batch_to_flush_and_counts_its_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 48: the rows after the fatal one in its batch were already off the queue, and were lost uncounted (the
    earlier tests kept the fatal row alone in its batch). Here it is in the middle of one batch, with a flush
    waiting on it."""
    died: list[type] = []
    monkeypatch.setattr(threading, "excepthook", lambda hook: died.append(hook.exc_type))
    store = StoreLogger(tmp_path / "logs.db")
    writer = RolloutLogWriter(store, min_interval_s=5.0)  # the thread waits 5 s for more: one batch, cut short by flush

    def kill() -> None:
        raise KillsTheWriterThread()

    try:
        writer.log("r1", lambda: make_row("r1", [1.0]))
        writer.log("kills-the-thread", kill)
        writer.log("r2", lambda: make_row("r2", [1.0]))
        writer.log("r3", lambda: make_row("r3", [1.0]))
        started = time.monotonic()
        writer.flush(timeout_s=30)  # its marker is in the same batch
        assert time.monotonic() - started < 5  # released, not the 30 s timeout
        assert died == [KillsTheWriterThread] and not writer._thread.is_alive()
        assert [r.execution_metadata.rollout_id for r in store.read()] == ["r1", "r2", "r3"]
        assert (writer.queued, writer.written, writer.failures) == (4, 3, 1)  # the fatal row counted, not lost
        assert "could not write rollout kills-the-thread" in caplog.text and "2 row updates after it" in caplog.text
    finally:
        writer.close()


def test_updates_left_by_a_dead_writer_thread_are_superseded_by_newer_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The batch's rest goes back ahead of what was queued after it: an episode's newer update still wins."""
    monkeypatch.setattr(threading, "excepthook", lambda hook: None)
    store = StoreLogger(tmp_path / "logs.db")
    writer = RolloutLogWriter(store, min_interval_s=5.0)
    building, release = threading.Event(), threading.Event()

    def kill_when_released() -> None:
        building.set()
        release.wait(10)
        raise KillsTheWriterThread()

    try:
        writer.log("first", kill_when_released)  # the thread waits up to 5 s for more before its batch
        writer.log("r1", lambda: make_row("r1", [0.1]))
        writer._hurry.set()  # the thread takes the batch now
        assert building.wait(10)
        writer.log("r1", lambda: make_row("r1", [0.1, 0.2]))  # queued while the batch with r1's older update is out
        release.set()
        writer._thread.join(10)
        writer.flush()
        assert [r.execution_metadata.extra["step_rewards"] for r in store.read()] == [[0.1, 0.2]]
        assert (writer.written, writer.failures) == (1, 1)
    finally:
        writer.close()


def test_token_view_marks_sampled_tokens_by_turn_and_masks_the_rest() -> None:
    traj = Trajectory(
        prompt_ids=(1, 2),
        completion_ids=(10, 11, 90, 91, 12),
        logprobs=(-0.5, -0.25, 0.0, 0.0, -1.23456),
        env_mask=(1, 1, 0, 0, 1),
    )
    view = token_view(traj, ["a", "b", "c", "d", "e", "f", "g"])
    assert view["token_ids"] == [1, 2, 10, 11, 90, 91, 12]
    assert view["mask"] == [0, 0, 1, 1, 0, 0, 2]  # prompt and inserted tokens 0, sampled tokens their turn
    assert view["logprobs"] == [None, None, -0.5, -0.25, None, None, -1.2346]
    assert view["num_turns"] == 2 and view["detokenized_tokens"] == ["a", "b", "c", "d", "e", "f", "g"]
