"""What ep_trl closes when the training process ends, however it ends.

Rollout functions (their event loop, environment sessions, log rows, the processor's endpoint) and the environment
servers ep_trl started are registered here when they are made and closed, newest first:

* **normal exit**: at interpreter exit (``atexit``), for what the program did not close itself (``GRPOTrainer``
  never closes its ``rollout_func``);
* **SIGTERM** (how ``timeout``, Slurm, ``docker stop`` and Kubernetes end a job): unless the program set a SIGTERM
  handler of its own, ep_trl's raises :class:`Terminated` in the main thread, a ``SystemExit`` with status 143
  (128 + SIGTERM, what a shell reports for a process SIGTERM ended). Training unwinds as it does on Ctrl-C: the
  rollout call in flight is cancelled and its sessions closed, ``finally`` blocks run, then the exit closes the
  rest. A program with its own handler keeps it, and ep_trl still closes at exit;
* **SIGKILL** (or a crash): nothing runs in the process, so every process ep_trl starts runs under
  ``ep_trl/guard.py``, which stops it within a second of its parent's death (``ep_trl.processes.guarded``).
"""

import atexit
import itertools
import logging
import signal
import threading
import weakref
from typing import Protocol

logger = logging.getLogger(__name__)


class Closable(Protocol):
    def close(self) -> None: ...


class Terminated(SystemExit):
    """Raised in the main thread by ep_trl's SIGTERM handler: the process exits with status 143 after cleanup."""

    def __init__(self) -> None:
        super().__init__(128 + signal.SIGTERM)


_registered: "weakref.WeakValueDictionary[int, Closable]" = weakref.WeakValueDictionary()
_order = itertools.count()
_lock = threading.Lock()


def register(resource: Closable) -> None:
    """Close ``resource`` when the process ends, unless it was closed (``unregister``) or collected before."""
    with _lock:
        _registered[next(_order)] = resource
    handle_sigterm()


def unregister(resource: Closable) -> None:
    with _lock:
        for key, value in list(_registered.items()):
            if value is resource:
                del _registered[key]


def close_all() -> None:
    """Close every registered resource, newest first (a rollout function before the servers it plays on)."""
    with _lock:
        resources = [_registered[key] for key in sorted(_registered, reverse=True) if key in _registered]
        _registered.clear()
    for resource in resources:
        resource.close()


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
    signal.signal(signal.SIGTERM, _on_sigterm)
    return True


def _on_sigterm(signum: int, frame: object) -> None:
    logger.warning("ep_trl: SIGTERM received; closing rollouts and the environment servers ep_trl started, then "
                   "exiting with status 143")
    raise Terminated()


atexit.register(close_all)
