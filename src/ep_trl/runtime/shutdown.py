"""What ep_trl closes when the training process ends, however it ends (docs/failures.md, "When the trainer itself
ends", says it all with the reasons).

Rollout functions and the servers ep_trl started are registered here and closed newest first: at a normal exit, and
at SIGTERM, whose handler raises :class:`Terminated` (status 143) in the main thread unless the program has its own.
A raise can be lost, so three paths make the exit certain: an unraisable hook delivers a dropped one again; the next
rollout call raises it (:func:`raise_if_terminating`); and :data:`CLOSE_RESERVE_S` before the stop grace
(:func:`current_grace_s`) ends, ep_trl writes queued log rows, closes what is registered and then exits with 143. A
forked child starts with nothing registered. The watcher runs on one daemon thread: a signal handler only writes a
byte to a pipe. SIGKILL is ``ep_trl/runtime/guard.py``'s.
"""

import atexit
import itertools
import logging
import os
import signal
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Protocol

from ..errors import ProcessExitingError
from .grace import DEFAULT_STOP_GRACE_S, GRACE_ENV, env_grace_s

logger = logging.getLogger(__name__)

#: How long before the grace ends ep_trl closes what it opened itself, if the exit has not (at most half the grace).
CLOSE_RESERVE_S = 5.0
#: How many times a dropped signal is delivered again before the deadline alone is left to end the process.
MAX_REDELIVERIES = 50


class Closable(Protocol):
    def close(self) -> None: ...


class Terminated(SystemExit):
    """Raised in the main thread by ep_trl's SIGTERM handler: the process exits with status 143 after cleanup."""

    def __init__(self) -> None:
        super().__init__(128 + signal.SIGTERM)


_registered: "weakref.WeakValueDictionary[int, Closable]" = weakref.WeakValueDictionary()
_order = itertools.count()
_lock = threading.Lock()
#: Called with the seconds left before a forced exit, first thing when ep_trl closes for it (the ep logs rows).
_before_forced_exit: list[Callable[[float], None]] = []


def current_grace_s() -> float:
    """The stop grace in force: the newest ``RolloutOptions(stop_grace_s=...)`` registered, else
    ``EP_TRL_STOP_GRACE_S``, else :data:`DEFAULT_STOP_GRACE_S`. Raises ``ConfigError`` for a bad variable."""
    return _state.grace_option if _state.grace_option is not None else env_grace_s()


def register(resource: Closable, stop_grace_s: float | None = None) -> None:
    """Close ``resource`` when the process ends, unless it was closed (``unregister``) or collected before.
    ``stop_grace_s`` (a rollout function's ``RolloutOptions.stop_grace_s``) sets the process's stop grace; without it
    ``EP_TRL_STOP_GRACE_S`` is read here, so a bad value fails when the resource is made."""
    if stop_grace_s is not None:
        _state.grace_option = stop_grace_s
    _state.grace_s = current_grace_s()
    with _lock:
        _registered[next(_order)] = resource
    handle_sigterm()


def unregister(resource: Closable) -> None:
    with _lock:
        for key, value in list(_registered.items()):
            if value is resource:
                del _registered[key]
    _release_if_idle()


def seconds_left() -> float | None:
    """Seconds until the stop grace ends and ep_trl forces the exit, once a SIGTERM arrived; None before (or in a
    process whose SIGTERM handler is not ep_trl's). What a close that waits on others must fit in."""
    return _state.seconds_left()


def before_forced_exit(flush: Callable[[float], None]) -> None:
    """Call ``flush(seconds_left)`` when ep_trl closes for a forced exit, before anything else is closed (the
    ``ep logs`` rows still queued); it must return within ``seconds_left``."""
    _before_forced_exit.append(flush)


def close_all() -> None:
    """Close every registered resource, newest first (a rollout function before the servers it plays on).

    A resource stays registered until its own close has run, and every one is closed even when an earlier one fails
    or is interrupted (``KeyboardInterrupt``); the failures are logged, then raised: an interruption first, else the
    errors together."""
    with _lock:
        keys = sorted(_registered, reverse=True)
    failures: list[BaseException] = []
    for key in keys:
        with _lock:
            resource = _registered.get(key)
        if resource is None:  # closed (unregistered) or collected meanwhile
            continue
        try:
            resource.close()
        except BaseException as error:  # one failed or interrupted close must not leave the rest open
            logger.error("ep_trl: closing %r failed", resource, exc_info=True)
            failures.append(error)
        finally:
            with _lock:
                _registered.pop(key, None)
            del resource
    _release_if_idle()
    interrupted = [error for error in failures if not isinstance(error, Exception)]
    if interrupted:
        raise interrupted[0]
    if len(failures) == 1:
        raise failures[0]
    if failures:
        raise ExceptionGroup("ep_trl: several resources failed to close", failures)  # type: ignore[type-var]


def handle_sigterm() -> bool:
    """Install ep_trl's SIGTERM handler if the program has none of its own; whether ep_trl's is in place. Only the
    main thread can install one; from another thread this does nothing (the program's exit still closes)."""
    if threading.current_thread() is not threading.main_thread():
        return signal.getsignal(signal.SIGTERM) is _on_sigterm
    current = signal.getsignal(signal.SIGTERM)
    if current is _on_sigterm:
        return True
    if current not in (signal.SIG_DFL, None):
        return False
    _state.start_watcher()
    if sys.unraisablehook is not _on_unraisable:
        _state.previous_unraisablehook = sys.unraisablehook
        sys.unraisablehook = _on_unraisable
    signal.signal(signal.SIGTERM, _on_sigterm)
    return True


def _release_if_idle() -> None:
    """Nothing registered and no SIGTERM being handled: the process gets its SIGTERM disposition and unraisable hook
    back, and the stop grace its default (only the main thread can set a signal handler; elsewhere they stay)."""
    if threading.current_thread() is not threading.main_thread():
        return
    with _lock:
        if len(_registered) or _state.received is not None:
            return
        _state.grace_option = None
    if signal.getsignal(signal.SIGTERM) is _on_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if sys.unraisablehook is _on_unraisable:
        sys.unraisablehook = _state.previous_unraisablehook


def raise_if_terminating() -> None:
    """What every rollout call does first. Once ep_trl has closed (or is closing) what it opened for the process's
    exit, :class:`~ep_trl.errors.ProcessExitingError`, in any thread; before that, :class:`Terminated` in the main
    thread when a SIGTERM arrived and the process is still going (code that catches ``BaseException`` swallowed the
    first raise): a rollout call never starts after a SIGTERM."""
    refuse_if_closed()
    if _state.received is not None and threading.current_thread() is threading.main_thread():
        _state.in_flight = True
        raise Terminated()


def refuse_if_closed() -> None:
    """:class:`~ep_trl.errors.ProcessExitingError` once ep_trl has closed (or is closing) for the process's exit."""
    if not _state.closing.is_set():
        return
    if _state.received is None:
        why = "the interpreter is exiting"
    else:
        why = (
            f"a SIGTERM arrived {time.monotonic() - _state.received:.0f} s ago (stop grace "
            f"{_state.grace_s:g} s, RolloutOptions(stop_grace_s=...) or {GRACE_ENV})"
        )
    raise ProcessExitingError(
        f"ep_trl has closed its rollout functions and the environment servers it started "
        f"because the process is exiting: {why}. No rollout call can start now; let the "
        "process end."
    )


def _on_sigterm(signum: int, frame: object) -> None:
    """ep_trl's SIGTERM handler. It runs between two bytecodes of the main thread, so it only writes to the
    watcher's pipe and raises: no lock, no thread, no logging."""
    if _state.received is None:
        _state.received = time.monotonic()
        _state.notify(_RECEIVED)
    if _state.closing.is_set() or _state.in_flight:
        return  # an exit is under way (closing, or a Terminated unwinding): let it finish within the grace
    _state.in_flight = True
    raise Terminated()


def _on_unraisable(unraisable: "sys.UnraisableHookArgs") -> None:
    """``sys.unraisablehook``: a :class:`Terminated` or ``KeyboardInterrupt`` that Python dropped is delivered again,
    once this hook has returned (the watcher waits for that: a signal that lands in here would be dropped too)."""
    _state.hook_depth += 1
    try:
        _state.previous_unraisablehook(unraisable)
        _redeliver_if_ours(unraisable.exc_value)
    except (Terminated, KeyboardInterrupt) as landed_here:  # a signal arrived while this hook ran: deliver it again
        _redeliver_if_ours(landed_here)
    finally:
        _state.hook_depth -= 1


def _redeliver_if_ours(error: BaseException | None) -> None:
    if isinstance(error, Terminated) and signal.getsignal(signal.SIGTERM) is _on_sigterm:
        _state.in_flight = False
        _state.notify(_DROPPED_TERM)
    elif isinstance(error, KeyboardInterrupt) and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        _state.notify(_DROPPED_INT)


_RECEIVED, _DROPPED_TERM, _DROPPED_INT = b"T", b"D", b"I"


class _SignalState:
    """What the handler, the unraisable hook and the watcher thread share. ``received``, ``in_flight`` are written by
    the main thread only (the handler runs there); the watcher reads them."""

    def __init__(self) -> None:
        self.received: float | None = None
        self.in_flight = False
        self.hook_depth = 0  # > 0 while the main thread runs the unraisable hook
        self.closing = threading.Event()  # set by whoever closes for the exit: the exit itself, or the deadline
        self.closed = threading.Event()
        self._claim = threading.Lock()
        #: held by the watcher from its check to its signal, and by the exit while it restores SIGTERM's default: a
        #: dropped signal is never delivered again once that default is in place (the process would end by the
        #: signal, not with status 143)
        self.redelivery = threading.Lock()
        self.previous_unraisablehook = sys.unraisablehook
        self.grace_option: float | None = None  # the newest RolloutOptions(stop_grace_s=...) registered
        self.grace_s = DEFAULT_STOP_GRACE_S  # the grace in force, as the last registration read it
        self._pipe: tuple[int, int] | None = None
        self._watcher: threading.Thread | None = None

    def notify(self, what: bytes) -> None:
        if self._pipe is not None:
            try:
                os.write(self._pipe[1], what)
            except BlockingIOError:  # the pipe is full: the watcher has thousands of bytes to read already
                return

    def start_watcher(self) -> None:
        if self._watcher is not None:
            return
        read, write = os.pipe()
        os.set_blocking(write, False)
        self._pipe = (read, write)
        self._watcher = threading.Thread(target=self._watch, args=(read,), name="ep-trl-signals", daemon=True)
        self._watcher.start()

    def forget_in_child(self) -> None:
        """After ``fork``: the child has no watcher thread and must not write to its parent's pipe."""
        if self._pipe is not None:
            for fd in self._pipe:
                os.close(fd)
        self._pipe = self._watcher = None
        self.received = None
        self.in_flight = False
        self.closing, self.closed, self._claim = threading.Event(), threading.Event(), threading.Lock()
        self.redelivery = threading.Lock()  # the parent's watcher may have held it at the fork
        if sys.unraisablehook is _on_unraisable:
            sys.unraisablehook = self.previous_unraisablehook
        if signal.getsignal(signal.SIGTERM) is _on_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)

    def _watch(self, read: int) -> None:
        redelivered = 0
        deadline_started = False
        while True:
            what = os.read(read, 1)
            if what == _RECEIVED and not deadline_started:
                deadline_started = True
                logger.warning(
                    "ep_trl: SIGTERM received; closing rollouts and the environment servers ep_trl "
                    "started, then exiting with status 143 (ending it %g s from now at the latest: the "
                    "stop grace, RolloutOptions(stop_grace_s=...) or %s)",
                    self.grace_s,
                    GRACE_ENV,
                )
                threading.Thread(target=self._deadline, name="ep-trl-exit-deadline", daemon=True).start()
            elif what in (_DROPPED_TERM, _DROPPED_INT) and redelivered < MAX_REDELIVERIES:
                redelivered += 1
                if not self._deliver_again(signal.SIGTERM if what == _DROPPED_TERM else signal.SIGINT):
                    return

    def _deliver_again(self, signum: int) -> bool:
        """Send ``signum`` to the main thread once it has left the unraisable hook, unless the exit is under way (its
        close started, or SIGTERM's default is back); whether the main thread is there to send to."""
        waited = time.monotonic() + 1.0
        while self.hook_depth and time.monotonic() < waited:
            time.sleep(0.001)
        main = threading.main_thread().ident
        if main is None:  # never started: nothing to deliver to
            return False
        name = signal.Signals(signum).name
        ours = _on_sigterm if signum == signal.SIGTERM else signal.default_int_handler
        with self.redelivery:
            if signal.getsignal(signum) is not ours or (signum == signal.SIGTERM and self.closing.is_set()):
                logger.warning("ep_trl: Python dropped the exception raised for %s; the exit is under way", name)
                return True
            logger.warning(
                "ep_trl: Python dropped the %s raised for %s (it arrived where exceptions are ignored); "
                "delivering the signal again",
                "SystemExit" if signum == signal.SIGTERM else "KeyboardInterrupt",
                name,
            )
            try:
                signal.pthread_kill(main, signum)
            except ProcessLookupError:  # the main thread has ended: the interpreter is exiting already
                return False
        return True

    def claim_close(self) -> bool:
        """Whether the caller is the one to close what is registered for the exit (the exit or the deadline)."""
        with self._claim:
            if self.closing.is_set():
                return False
            self.closing.set()
            return True

    def close_for_exit(self) -> None:
        try:
            close_all()
        finally:
            self.closed.set()

    def seconds_left(self) -> float | None:
        """Until the grace ends, once a SIGTERM arrived."""
        return None if self.received is None else max(0.0, self.received + self.grace_s - time.monotonic())

    def _deadline(self) -> None:
        received = self.received if self.received is not None else time.monotonic()
        grace = self.grace_s
        exit_at = received + grace
        close_at = exit_at - min(CLOSE_RESERVE_S, grace / 2)
        if not self.closed.wait(max(0.0, close_at - time.monotonic())):
            logger.warning(
                "ep_trl: %.0f s after SIGTERM the process is still running; writing the ep logs rows, "
                "closing what ep_trl opened and exiting with status 143 when the stop grace of %g s ends",
                close_at - received,
                grace,
            )
            if self.claim_close():
                threading.Thread(target=self._close_logged, name="ep-trl-exit-close", daemon=True).start()
            for flush in list(_before_forced_exit):  # the rows, whoever closes and wherever that close hangs
                try:
                    flush(max(0.0, exit_at - time.monotonic() - 0.2))
                except Exception:  # logged; the forced exit must come whatever a flush does
                    logger.error("ep_trl: %r failed before the forced exit", flush, exc_info=True)
        time.sleep(max(0.0, exit_at - time.monotonic()))
        logger.error(
            "ep_trl: the process did not exit within %g s of SIGTERM (the stop grace); exiting with status 143 now",
            grace,
        )
        _flush_output()
        os._exit(128 + signal.SIGTERM)

    def _close_logged(self) -> None:
        try:
            self.close_for_exit()
        except Exception:  # each failure was logged by close_all; the deadline exits regardless
            return


def _flush_output() -> None:
    for handler in logging.getLogger().handlers + logger.handlers:
        try:
            handler.flush()
        except (OSError, ValueError):  # a closed stream: nothing left to flush there
            continue
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            continue


def _close_at_exit() -> None:
    """At interpreter exit: close what is registered, or wait (within the grace) for the deadline's close.

    A close that fails (logged by :func:`close_all`, with the resource and its error) does not change how a SIGTERM's
    exit ends: the status stays 143. Without a SIGTERM the failure is raised again, as Python reports an exit
    handler's error."""
    failed: BaseException | None = None
    if _state.claim_close():
        try:
            _state.close_for_exit()
        except BaseException as error:  # logged by close_all; the exit below must still run (a SIGTERM's status)
            failed = error
    else:
        _state.closed.wait(_state.seconds_left())
    with _state.redelivery:
        if _state.received is not None and signal.getsignal(signal.SIGTERM) is _on_sigterm:
            # what ep_trl opened is closed: past here (the other exit handlers, the interpreter's teardown) a further
            # SIGTERM, a scheduler's second, ends the process at once
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
    ended_by = getattr(sys, "last_value", None)  # what ended the main thread, when an exception did
    if _state.received is not None and _replaced_terminated(ended_by):
        logger.warning(
            "ep_trl: the SIGTERM's exit was replaced on its way out by %s (raised while it unwound); "
            "exiting with status 143",
            type(ended_by).__name__,
        )
        _flush_output()
        os._exit(128 + signal.SIGTERM)
    if failed is not None and _state.received is None:
        raise failed
    if failed is not None:  # raised here, it could not change the status; an interruption would be delivered again
        logger.warning(
            "ep_trl: closing for the SIGTERM's exit failed (%s: %s, logged above); the exit goes on",
            type(failed).__name__,
            failed,
        )


def _replaced_terminated(error: BaseException | None) -> bool:
    """Whether ``error`` is not :class:`Terminated` but was raised while one was being handled."""
    if error is None or isinstance(error, Terminated):
        return False
    seen: set[int] = set()
    cause = error.__context__ or error.__cause__
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, Terminated):
            return True
        seen.add(id(cause))
        cause = cause.__context__ or cause.__cause__
    return False


def _forget_in_child() -> None:
    """After ``fork``: the child owns nothing its parent registered, and has none of its parent's threads."""
    global _lock
    _lock = threading.Lock()
    _registered.clear()
    _state.forget_in_child()


_state = _SignalState()
os.register_at_fork(after_in_child=_forget_in_child)
atexit.register(_close_at_exit)
