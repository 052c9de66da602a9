"""eval-protocol's row store, the one ``ep logs`` reads: the default one, or one under another home directory."""

import os
from pathlib import Path
from typing import Protocol

from ..trajectory.types import Row
from ._private import private_name


class DatasetLogger(Protocol):
    """What eval-protocol asks of a dataset logger (its ``DatasetLogger`` base class's two methods): processors log
    their rows as they go, and ``read`` gives a rollout's rows back."""

    def log(self, row: Row, /) -> None: ...

    def read(self, rollout_id: str | None = None, /) -> list[Row]: ...


def make_dataset_logger(log_home: str | os.PathLike | None) -> DatasetLogger:
    """eval-protocol's default logger (``~/.eval_protocol/logs.db``), or one under ``log_home/.eval_protocol``.

    ``ep logs`` reads ``$HOME/.eval_protocol/logs.db``, so rows sent to ``log_home`` show with
    ``HOME=<log_home> ep logs``.
    """
    if log_home is None:
        from eval_protocol.dataset_logger import default_logger

        return default_logger
    store = Path(log_home).expanduser() / ".eval_protocol"
    store.mkdir(parents=True, exist_ok=True)
    return StoreLogger(store / "logs.db")


class StoreLogger:
    """A DatasetLogger for one ``logs.db`` that also announces each row there, for live ``ep logs`` updates.

    eval-protocol's own ``SqliteDatasetLoggerAdapter(db_path=...)`` stores rows in ``db_path`` but announces them
    on the event bus of ``~/.eval_protocol/logs.db``: an ``ep logs`` started with ``HOME=<log_home>`` would then
    show new rows only after a manual refresh. Here rows and their "log" events go to the same file.
    """

    def __init__(self, db_path: str | os.PathLike) -> None:
        row_store = private_name("eval_protocol.dataset_logger.sqlite_evaluation_row_store", "SqliteEvaluationRowStore")
        event_bus = private_name("eval_protocol.event_bus.sqlite_event_bus_database", "SqliteEventBusDatabase")
        self.db_path = str(db_path)
        self._store = row_store(self.db_path)
        self._events = event_bus(self.db_path)
        self._event_type = private_name("eval_protocol.dataset_logger.dataset_logger", "LOG_EVENT_TYPE")
        self._process_id = str(os.getpid())  # the event bus's sender id: listeners skip their own events

    def log(self, row: Row) -> None:
        data = row.model_dump(exclude_none=True, mode="json")
        self._store.upsert_row(data=data)
        self._events.publish_event(self._event_type, data, self._process_id)

    def read(self, rollout_id: str | None = None) -> list[Row]:
        from eval_protocol.models import EvaluationRow

        return [EvaluationRow(**data) for data in self._store.read_rows(rollout_id=rollout_id)]
