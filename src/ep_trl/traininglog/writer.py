"""Training rollouts in eval-protocol's dataset logger (the store ``ep logs`` reads), written off the hot path.

Updates are handed to a background writer thread as row *builders*; an episode's successive updates (started,
after each step, scored) that are still queued when the writer gets to them collapse into the newest one, and
only that one is built and written. The writer waits ``min_interval_s`` after the first update it sees before
draining (``ep logs`` polls for new rows once a second anyway), so rows reach the store within about that
time, and an episode costs one write per second it runs plus its final one, not one per step. Training never
waits on row building or SQLite, except in ``flush()``/``close()`` (which cut the wait short). Should the writer
thread die (an error it does not expect), ``flush()``/``close()`` write what is still queued themselves, the rest of
the batch it died in included: the row it died on is counted in ``failures``, the updates after it are queued again
ahead of newer ones, and the flushes waiting on that batch are released by whoever writes them.

The final row of an episode also carries the token view that the ``ep logs`` UI draws in its "Token Debug"
panel (``execution_metadata.extra["full_episode"]``: token ids, the loss mask by turn, sampled-token logprobs,
per-token text). Building it (detokenization included) happens on the writer thread too.
"""

import atexit
import logging
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias

from ..runtime import shutdown
from ..trajectory.tokens import Trajectory
from ..trajectory.types import JSONObject, Row, Tokenizer

if TYPE_CHECKING:  # the protocol only: the writer is handed a logger, it does not import the store
    from ..evalprotocol.store import DatasetLogger

logger = logging.getLogger(__name__)

#: Episodes longer than this (prompt + completion tokens) are logged without the per-token view: the UI parses
#: every row of the store on load, and ``ep logs`` re-reads the whole store every 2 s, so store size matters.
TOKEN_VIEW_MAX_TOKENS = 2048
#: How often ``flush()`` checks, while it waits, that the writer thread is still alive to write what it waits for.
LIVENESS_CHECK_S = 0.1


@dataclass(frozen=True)
class EpisodeTokens:
    """An episode's tokens, handed to the writer, which turns them into the UI's token view."""

    tokenizer: Tokenizer
    trajectory: Trajectory


def token_view(trajectory: Trajectory, texts: Sequence[str]) -> JSONObject:
    """``extra["full_episode"]`` as the ``ep logs`` Token Debug panel reads it.

    ``mask`` is 0 for tokens without loss (the prompt and the inserted template/environment tokens, ``env_mask``
    0) and the 1-based turn number for sampled tokens, so the panel colours exactly what TRL trains on.
    ``logprobs`` holds the sampled tokens' logprobs (rounded for display) and null elsewhere.
    """
    n_prompt = len(trajectory.prompt_ids)
    turns = trajectory.turn_numbers()
    mask = [0] * n_prompt + list(turns)
    logprobs: list[float | None] = [None] * n_prompt
    logprobs += [round(float(lp), 4) if t else None for lp, t in zip(trajectory.logprobs, turns)]
    return {
        "token_ids": [*trajectory.prompt_ids, *trajectory.completion_ids],
        "mask": mask,
        "logprobs": logprobs,
        "detokenized_tokens": list(texts),
        "num_turns": max(turns, default=0),
    }


class _TokenTexts:
    """Per-token text for one tokenizer, decoded once per distinct id (a vocabulary is small; episodes repeat)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self._cache: dict[int, str] = {}

    def __call__(self, token_ids: Sequence[int]) -> list[str]:
        missing = list(dict.fromkeys(t for t in token_ids if t not in self._cache))
        if missing:
            decoded = self.tokenizer.batch_decode([[t] for t in missing], skip_special_tokens=False)
            self._cache.update(zip(missing, decoded))
        return [self._cache[t] for t in token_ids]


#: What the writer's queue holds: a row update (rollout id, how to build the row, the episode's tokens if final), a
#: flush marker, or None (stop).
_Queued: TypeAlias = "tuple[str, Callable[[], Row], EpisodeTokens | None] | threading.Event | None"


class RolloutLogWriter:
    """Queues row updates and writes the newest of each rollout to a DatasetLogger from one daemon thread.

    Writers still open when the interpreter exits are flushed then (a training script rarely closes its rollout
    function, and the last step's final rows would otherwise be lost with the daemon thread).

    ``enqueue_s`` is the time callers spent in ``log()`` (the only part on the training path); ``write_s`` the
    writer thread's own time (token views, serialization, SQLite), ``token_view_s`` the token views' share of
    it. They are for benchmarks and diagnostics.
    """

    def __init__(
        self,
        dataset_logger: "DatasetLogger",
        token_view_max_tokens: int = TOKEN_VIEW_MAX_TOKENS,
        min_interval_s: float = 1.0,
    ) -> None:
        self._logger = dataset_logger
        self._token_view_max_tokens = token_view_max_tokens
        self._min_interval_s = min_interval_s
        self._hurry = threading.Event()  # set by flush()/close() to end the writer's pause early
        self._texts: dict[int, _TokenTexts] = {}
        self._queue: queue.Queue[_Queued] = queue.Queue()
        self._thread = threading.Thread(target=self._drain, name="ep-trl-rollout-log", daemon=True)
        self._owner = os.getpid()  # a forked child's copy has no writer thread: its rows are the parent's to write
        self._here = threading.Lock()  # one caller at a time writes here once the thread has ended
        self._left: list[_Queued] = []  # what a batch left unwritten when an error ended its writing: taken first
        self._left_lock = threading.Lock()
        self._closed = False
        self._told_thread_ended = False
        self.queued = 0
        self.written = 0
        self.failures = 0
        self.enqueue_s = 0.0
        self.write_s = 0.0
        self.token_view_s = 0.0
        self._thread.start()
        _open_writers.add(self)

    def log(self, rollout_id: str, build: Callable[[], Row], tokens: EpisodeTokens | None = None) -> None:
        """Queue an update of one rollout's row, with the episode's tokens if it is the final one.

        ``build()`` makes the row; it runs on the writer thread, only if this is still the rollout's newest
        update there, so it must use snapshots of what the caller may change later. The row it returns is the
        writer's (a final row is handed over as ``lambda: row``).
        """
        if self._closed:
            raise RuntimeError("RolloutLogWriter is closed")
        started = time.perf_counter()
        self._queue.put((rollout_id, build, tokens))
        self.queued += 1
        self.enqueue_s += time.perf_counter() - started

    def flush(self, timeout_s: float = 30.0) -> None:
        """Wait until every queued row is written, for at most ``timeout_s``. When the writer thread has ended (closed,
        or killed by an error it did not expect, which threading printed) the rows still queued are written here, in
        the calling thread, not dropped. A forked child's copy writes nothing: its rows are the parent's."""
        if os.getpid() != self._owner:
            return
        if self._thread.is_alive():
            done = threading.Event()
            self._queue.put(done)
            self._hurry.set()
            deadline = time.monotonic() + timeout_s
            while not done.wait(max(0.0, min(LIVENESS_CHECK_S, deadline - time.monotonic()))):
                if not self._thread.is_alive():  # ended while this waited: what it left is written below
                    break
                if time.monotonic() >= deadline:
                    logger.warning("rollout log writer did not drain within %.0f s", timeout_s)
                    return
            else:
                return
        self._write_here()

    def _write_here(self) -> None:
        """Write what is queued in the calling thread: the writer thread has ended."""
        with self._here:
            batch = self._take_queued()
            updates = sum(isinstance(item, tuple) for item in batch)
            if updates and not self._closed and not self._told_thread_ended:
                self._told_thread_ended = True
                logger.warning(
                    "the rollout log writer thread has ended (its error is above); writing the %d row "
                    "updates queued in the calling thread, at each flush() and at close()",
                    updates,
                )
            self._write_batch(batch)

    def close(self) -> None:
        """Write what is queued and stop the writer thread."""
        if self._closed:
            return
        self.flush()
        _open_writers.discard(self)
        self._closed = True
        self._queue.put(None)
        self._hurry.set()
        self._thread.join(timeout=10)

    def _drain(self) -> None:
        while True:
            first = self._queue.get()
            if isinstance(first, tuple):  # an update: give the episode's next ones a moment to supersede it
                self._hurry.wait(self._min_interval_s)
            self._hurry.clear()
            if self._write_batch([first, *self._take_queued()]):
                return

    def _take_queued(self) -> list[_Queued]:
        """What an interrupted batch left (older updates), then what is queued."""
        with self._left_lock:
            batch, self._left = self._left, []
        while True:
            try:
                batch.append(self._queue.get_nowait())
            except queue.Empty:
                return batch

    def _write_batch(self, batch: list[_Queued]) -> bool:
        """Write the newest update of each rollout in ``batch``, then release the flushes waiting on it; whether it
        held the stop sentinel."""
        newest: dict[str, tuple[Callable[[], Row], EpisodeTokens | None]] = {}
        markers: list[threading.Event] = []
        stop = False
        for item in batch:
            if item is None:
                stop = True
            elif isinstance(item, threading.Event):
                markers.append(item)
            else:
                rollout_id, build, tokens = item
                newest.pop(rollout_id, None)  # re-insert: rows are written in the order of their last update
                newest[rollout_id] = (build, tokens)
        pending = list(newest.items())
        for index, (rollout_id, (build, tokens)) in enumerate(pending):
            started = time.perf_counter()
            try:
                self._write(rollout_id, build, tokens)
            except BaseException:  # what _write does not expect, ending this thread: the batch's rest is not lost
                self._hand_back(rollout_id, pending[index + 1 :], markers)
                raise
            self.write_s += time.perf_counter() - started
        for marker in markers:
            marker.set()
        return stop

    def _hand_back(
        self,
        failed: str,
        rest: list[tuple[str, tuple[Callable[[], Row], EpisodeTokens | None]]],
        markers: list[threading.Event],
    ) -> None:
        """An error ``_write`` does not expect ended the writing of a batch at rollout ``failed``: that row is
        counted as a failure (written again, the same error could end the caller of ``flush()``), the updates after
        it and the batch's flush markers go back ahead of the queue, for the next batch or the ``flush()``/``close()``
        that writes in its own thread to write and release."""
        self.failures += 1
        logger.warning(
            "could not write rollout %s to the eval-protocol log: an error ended its writing (shown "
            "next); the %d row updates after it in the batch are queued again",
            failed,
            len(rest),
        )
        with self._left_lock:
            self._left[:0] = [(rollout_id, build, tokens) for rollout_id, (build, tokens) in rest] + list(markers)

    def _write(self, rollout_id: str, build: Callable[[], Row], tokens: EpisodeTokens | None) -> None:
        try:
            row = build()
        except Exception as exc:  # a row that cannot be built is lost to the log, not to training; say so
            self.failures += 1
            logger.warning("could not build the log row of rollout %s: %s: %s", rollout_id, type(exc).__name__, exc)
            return
        if tokens is not None:
            started = time.perf_counter()
            try:
                self._attach_token_view(row, tokens)
            except Exception as exc:  # the row is still worth writing without its token view; say why
                row.execution_metadata.extra.setdefault("ep_trl", {})["token_view"] = (
                    f"failed: {type(exc).__name__}: {exc}"
                )
                logger.warning(
                    "no token view for rollout %s: %s: %s", row.execution_metadata.rollout_id, type(exc).__name__, exc
                )
            self.token_view_s += time.perf_counter() - started
        try:
            self._logger.log(row)
            self.written += 1
        except Exception as exc:  # logging must never take training down; say so, and count it
            self.failures += 1
            logger.warning(
                "could not write rollout %s to the eval-protocol log: %s: %s",
                row.execution_metadata.rollout_id,
                type(exc).__name__,
                exc,
            )

    def _attach_token_view(self, row: Row, tokens: EpisodeTokens) -> None:
        traj = tokens.trajectory
        n = len(traj.prompt_ids) + len(traj.completion_ids)
        extra = row.execution_metadata.extra
        if n > self._token_view_max_tokens:
            extra.setdefault("ep_trl", {})["token_view"] = (
                f"omitted: {n} tokens > {self._token_view_max_tokens} (ep_trl.traininglog.writer.TOKEN_VIEW_MAX_TOKENS)"
            )
            return
        texts = self._texts.get(id(tokens.tokenizer))
        if texts is None or texts.tokenizer is not tokens.tokenizer:
            texts = self._texts[id(tokens.tokenizer)] = _TokenTexts(tokens.tokenizer)
        extra["full_episode"] = token_view(traj, texts([*traj.prompt_ids, *traj.completion_ids]))


_open_writers: "weakref.WeakSet[RolloutLogWriter]" = weakref.WeakSet()


@atexit.register
def _close_open_writers() -> None:
    """At interpreter exit, before daemon threads stop: write what training queued but never flushed."""
    for writer in list(_open_writers):
        writer.close()


def _flush_open_writers(timeout_s: float) -> None:
    """Before a forced exit (``ep_trl.runtime.shutdown``): write what is queued, all within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    for writer in list(_open_writers):
        writer.flush(max(0.0, deadline - time.monotonic()))


shutdown.before_forced_exit(_flush_open_writers)
# a forked child's writers are its parent's: their rows are the parent's to write, at the parent's exit
os.register_at_fork(after_in_child=_open_writers.clear)
