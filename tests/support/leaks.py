"""A pytest plugin that fails a test module which leaves threads or child processes behind (issue 16).

A thread still generating, a server nobody stopped or a loop thread nobody closed slows every test after it on a
2-core machine (a tool model that builds in 50 s alone took 225 s late in the suite) and can outlive the run.
After each test module (its module fixtures torn down), the threads and child processes that did not exist before
the module started must be gone; what is left is named, child processes are killed, and the module's last test
errors at teardown. What session fixtures start (the letters server, set up by whichever test first asks for it)
belongs to the session: it is recorded when the fixture is set up and must be gone when the session ends.

Threads that libraries start and keep for the process's life are not this suite's leaks: :data:`PROCESS_WIDE_THREADS`
lists them by name, each with its owner. Eval modules run under ``pytest`` by a test (``tests/evals``) are the
user's evals, not this suite's tests: they are not checked.
"""

import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import psutil
import pytest

#: Substrings of the names of threads a library starts once per process and never ends (not a test's leak).
PROCESS_WIDE_THREADS = (
    "tqdm_monitor",  # tqdm's monitor, started with the first progress bar
    "litellm-logging",  # LiteLLM's logging worker, started with its first call
    "(_telemetry_worker)",  # eval-protocol's telemetry worker, started at import
    "rollout-trace-logger",  # TRL's AsyncGRPOTrainer: one per train(), idle on a queue, never ended (TRL 1.16)
    "pydevd",  # a debugger, when one is attached
    "ep-trl-signals",  # ep_trl.runtime.shutdown's signal watcher, started with its SIGTERM handler, idle on a pipe
    # ep_trl.runtime.threads' idle pooled threads: hold nothing, end after threads.IDLE_EXIT_S unused
    "ep-trl idle pooled thread",
)

#: Thread pools a library keeps for the life of the process, shut down at exit by their owner: (module, how to reach
#: the pool from that module once it is imported), each with its owner.
PROCESS_WIDE_POOLS: tuple[tuple[str, Callable[[Any], Any]], ...] = (
    # vLLM's image loading, once images were loaded
    ("vllm.multimodal.media.connector", lambda module: module.global_thread_pool),
    # torch inductor's compile workers (an lru_cache'd pool), once something compiled with a cold inductor cache
    (
        "torch._inductor.async_compile",
        lambda module: module.AsyncCompile.pool() if module.AsyncCompile.pool.cache_info().currsize else None,
    ),
)

#: How long a leaked thread or process gets to end on its own after the module's teardown (closing is async).
GRACE_S = 5.0


@dataclass(frozen=True)
class Snapshot:
    threads: frozenset[int]
    children: frozenset[int]

    @classmethod
    def now(cls) -> "Snapshot":
        return cls(
            frozenset(t.ident for t in threading.enumerate() if t.ident is not None),
            frozenset(p.pid for p in _children()),
        )

    def __or__(self, other: "Snapshot") -> "Snapshot":
        return Snapshot(self.threads | other.threads, self.children | other.children)


_session_owned = Snapshot(frozenset(), frozenset())


def _children() -> list[psutil.Process]:
    found = []
    for process in psutil.Process().children(recursive=True):
        try:
            if process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
        except psutil.NoSuchProcess:
            continue
    return found


def _pool_threads() -> set[threading.Thread]:
    threads: set[threading.Thread] = set()
    for name, reach in PROCESS_WIDE_POOLS:
        module = sys.modules.get(name)
        pool = reach(module) if module is not None else None
        threads |= set(getattr(pool, "_threads", ()))
    return threads


def _process_wide_children() -> set[int]:
    """multiprocessing's resource tracker, started once per process by the first spawned process (ep_trl's worker
    processes, ``RolloutOptions(worker_processes=N)``); it ends with this process (it reads a pipe only this process
    holds)."""
    tracker = sys.modules.get("multiprocessing.resource_tracker")
    pid = getattr(getattr(tracker, "_resource_tracker", None), "_pid", None)
    return {pid} if pid else set()


def leaked(before: Snapshot) -> tuple[list[threading.Thread], list[psutil.Process]]:
    known = before | _session_owned
    pools = _pool_threads()
    threads = [
        t
        for t in threading.enumerate()
        if t.ident not in known.threads
        and t.is_alive()
        and t not in pools
        and not any(name in t.name for name in PROCESS_WIDE_THREADS)
    ]
    process_wide = _process_wide_children()
    return threads, [p for p in _children() if p.pid not in known.children and p.pid not in process_wide]


def settled(before: Snapshot) -> tuple[list[threading.Thread], list[psutil.Process]]:
    """What is still left after up to ``GRACE_S`` seconds."""
    deadline = time.monotonic() + GRACE_S
    while True:
        threads, children = leaked(before)
        if (not threads and not children) or time.monotonic() > deadline:
            return threads, children
        time.sleep(0.1)


def describe(process: psutil.Process) -> str:
    try:
        return f"pid {process.pid}: {' '.join(process.cmdline())[:300]}"
    except psutil.Error:
        return f"pid {process.pid}"


def kill(processes: list[psutil.Process]) -> None:
    for process in processes:
        try:
            os.kill(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
    psutil.wait_procs(processes, timeout=5)


def report(threads: list[threading.Thread], children: list[psutil.Process]) -> list[str]:
    return [f"thread {t.name!r} ({'daemon' if t.daemon else 'non-daemon'})" for t in threads] + [
        f"child process {describe(p)}" for p in children
    ]


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef, request: pytest.FixtureRequest) -> Iterator[None]:
    """Record what a session fixture starts: it belongs to the session, not to the module that first asked."""
    if fixturedef.scope != "session":
        yield
        return
    global _session_owned
    before = Snapshot.now()
    yield
    after = Snapshot.now()
    _session_owned = _session_owned | Snapshot(after.threads - before.threads, after.children - before.children)


@pytest.fixture(scope="module", autouse=True)
def no_leaks_per_module(request: pytest.FixtureRequest) -> Iterator[None]:
    if request.module.__name__.startswith("tests.evals."):
        yield
        return
    before = Snapshot.now()
    yield
    threads, children = settled(before)
    problems = report(threads, children)  # before the kill: a dead process has no command line to name
    kill(children)
    if problems:
        pytest.fail("this module left behind (children were killed): " + "; ".join(problems), pytrace=False)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """After the session's own fixtures are torn down, no child process may be left (killed and failed if so)."""
    process_wide = _process_wide_children()  # ends with this process, after this check
    children = [p for p in _children() if p.pid not in process_wide]
    if children:
        described = "; ".join(map(describe, children))
        kill(children)
        print(f"\nThe test session left child processes behind (killed): {described}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
