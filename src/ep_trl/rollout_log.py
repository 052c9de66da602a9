"""Training rollouts in eval-protocol's dataset logger (the store ``ep logs`` reads), written off the hot path.

Rows are handed to a background writer thread; an episode's successive updates (started, after each step,
scored) that are still queued when the writer gets to them collapse into the newest one. Training never waits
on SQLite, except in ``flush()``/``close()``.
"""

import logging
import os
import queue
import threading
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


def make_dataset_logger(log_home: str | os.PathLike | None) -> Any:
    """eval-protocol's default logger (``~/.eval_protocol/logs.db``), or one under ``log_home/.eval_protocol``.

    ``ep logs`` reads ``$HOME/.eval_protocol/logs.db``, so rows sent to ``log_home`` show with
    ``HOME=<log_home> ep logs``.
    """
    if log_home is None:
        from eval_protocol.dataset_logger import default_logger

        return default_logger
    from eval_protocol.dataset_logger.sqlite_dataset_logger_adapter import SqliteDatasetLoggerAdapter

    store = Path(log_home).expanduser() / ".eval_protocol"
    store.mkdir(parents=True, exist_ok=True)
    return SqliteDatasetLoggerAdapter(db_path=str(store / "logs.db"))


class RolloutLogWriter:
    """Queues rows and writes them to a DatasetLogger from one daemon thread."""

    def __init__(self, dataset_logger: Any) -> None:
        self._logger = dataset_logger
        self._queue: queue.Queue[Any] = queue.Queue()
        self._thread = threading.Thread(target=self._drain, name="ep-trl-rollout-log", daemon=True)
        self._closed = False
        self.queued = 0
        self.written = 0
        self.failures = 0
        self._thread.start()

    def log(self, row: Any) -> None:
        """Queue a snapshot of ``row``; later changes to the caller's row are not seen."""
        if self._closed:
            raise RuntimeError("RolloutLogWriter is closed")
        self._queue.put(row.model_copy(deep=True))
        self.queued += 1

    def flush(self, timeout_s: float = 30.0) -> None:
        """Wait until every queued row is written."""
        done = threading.Event()
        self._queue.put(done)
        if not done.wait(timeout_s):
            logger.warning("rollout log writer did not drain within %.0f s", timeout_s)

    def close(self) -> None:
        if self._closed:
            return
        self.flush()
        self._closed = True
        self._queue.put(None)
        self._thread.join(timeout=10)

    def _drain(self) -> None:
        while True:
            batch = [self._queue.get()]
            while True:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            newest: dict[str, Any] = {}
            markers: list[threading.Event] = []
            stop = False
            for item in batch:
                if item is None:
                    stop = True
                elif isinstance(item, threading.Event):
                    markers.append(item)
                else:
                    newest[item.execution_metadata.rollout_id] = item
            for row in newest.values():
                self._write(row)
            for marker in markers:
                marker.set()
            if stop:
                return

    def _write(self, row: Any) -> None:
        try:
            self._logger.log(row)
            self.written += 1
        except Exception as exc:  # logging must never take training down; say so, and count it
            self.failures += 1
            logger.warning("could not write rollout %s to the eval-protocol log: %s: %s",
                           row.execution_metadata.rollout_id, type(exc).__name__, exc)
