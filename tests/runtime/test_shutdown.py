"""No process ep_trl starts outlives its trainer, and a SIGTERM ends training every time (issues 21 and 24).

A training process gets SIGTERM (how ``timeout``, Slurm, ``docker stop`` and Kubernetes end jobs) at any moment:
in the middle of a rollout call, while TRL collects a call's rollouts, between calls, and during a garbage
collection, where Python drops an exception a signal handler raises inside a ``__del__`` or a weakref callback (before
issue 24 that process trained on, 3 times in 4). Every one must exit with status 143 within seconds, with the rows
of its finished episodes in the ``ep logs`` store and no environment or MCP server left. With SIGKILL nothing runs in
the process, and the watchdog each server runs under stops it (for the MCP-gym server eval-protocol's processor starts
itself, the watchdog that adopted it). Each way the first raise can be lost is also pinned on
a small program of its own.
"""

import json
import math
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from ep_trl.runtime import grace, shutdown
from ep_trl.runtime.processes import port_holder

REPO = Path(__file__).resolve().parents[2]
#: The child programs import this checkout's ep_trl (src/) and its tests package.
CHILD_PYTHONPATH = os.pathsep.join([str(REPO / "src"), str(REPO)])
GONE_WITHIN_S = 10.0
#: The documented environment variable that sets the stop grace.
GRACE_ENV = "EP_TRL_STOP_GRACE_S"
#: The stop grace the training processes below run with (EP_TRL_STOP_GRACE_S): each ends by itself well within it.
TRAINING_GRACE_S = 9.0
#: A SIGTERM'd process has run its exit handlers (ep_trl's close among them) this long after the signal, or ep_trl
#: has ended it: the stop grace, and a little for a loaded machine to schedule the deadline's thread.
HANDLERS_BOUND_S = TRAINING_GRACE_S + 4.0
#: ... and is gone this long after the signal: then comes the interpreter's own teardown of torch's modules, which no
#: thread can cut short and ep_trl does not time (about 2 s on an idle 2-core machine; over 20 s was seen under a
#: load far above 2x the cores). A process that trains on (1000 steps) never ends, which is what this bound catches.
EXIT_BOUND_S = TRAINING_GRACE_S + 40.0


def child_environment() -> dict[str, str]:
    """This process's environment for a child, less ``PYTHONUNBUFFERED`` (CI and this machine's shell set it): with
    it the interpreter's writes of one traceback line are each a system call, which lets another thread in between
    them. The children flush what the tests read while they run (``flush=True``, ``say``)."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}


#: A log line of ep_trl's, as its threads write them while a SIGTERM'd child's main thread prints a traceback: the
#: signal watcher's "ep_trl: SIGTERM received; ..." and "... delivering the signal again", the deadline's. Each is
#: written whole, in one write.
EP_TRL_LOG_LINE = re.compile(r"ep_trl: [^\n]*\n")
#: Python dropped a raised Terminated in a finalizer: its "Exception ignored in ..." block, ending with the exception.
DROPPED = re.compile(r"Exception ignored in[^\n]*\n(.*\n){0,12}?[^\n]*Terminated: 143")


def main_thread_text(output: str) -> str:
    """``output`` less ep_trl's log lines, wherever they landed. The interpreter writes a traceback line in several
    writes, and a line another thread logs meanwhile can land between two of them ("RuntimeErrorep_trl: SIGTERM
    received; ...\\n: cannot release ..."), even without ``PYTHONUNBUFFERED`` when a thread switch falls there. Look
    for what the interpreter wrote (a traceback's lines) in this text; for a log line, in ``output`` itself."""
    return EP_TRL_LOG_LINE.sub("", output)


def descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def command(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline())
    except psutil.Error:
        return "?"


def processes_tagged(tag: str) -> list[tuple[int, str]]:
    """Live processes whose environment holds ``EP_TRL_TEST_RUN=tag``: whatever a run started, reparented or not."""
    marker = f"EP_TRL_TEST_RUN={tag}".encode()
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                process = psutil.Process(int(pid))
                if alive(process):
                    found.append((int(pid), command(process)))
        except (OSError, psutil.Error):
            continue
    return found


@pytest.fixture
def stdio_agent_config(tmp_path: Path) -> Path:
    config = tmp_path / "calc_stdio.json"
    config.write_text(
        json.dumps(
            {
                "mcpServers": {
                    "calc": {
                        "command": sys.executable,
                        "args": [str(REPO / "tests/fixtures/calc_mcp_server.py"), "stdio"],
                    }
                }
            }
        )
    )
    return config


CASES = {  # the eval, and what marks its servers in their command lines
    "docker": ("tests.evals.eval_guess_docker", "tests.fixtures.guess_env.server.app:app"),
    "stdio_mcp": ("tests.evals.eval_calculator_agent", "calc_mcp_server.py stdio"),
}
#: eval-protocol's FrozenLake MCP-gym server, which its MCPGymRolloutProcessor starts itself with a plain Popen (not
#: 9700, its default: other runs may hold it). Killed with its trainer before, it held its port and failed the next
#: run's every episode ("Port 9700 is already in use").
MCP_GYM_PORT = 9713
SIGKILL_CASES = {
    **CASES,
    "mcp_gym": ("tests.evals.eval_frozen_lake_other_port", f"frozen_lake/server.py --port {MCP_GYM_PORT}"),
}
#: The port a case's server answers on once it is up (the processor starts it inside its call and waits for it).
SERVER_PORTS = {"mcp_gym": MCP_GYM_PORT}


def port_answers(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        return probe.connect_ex(("localhost", port)) == 0


@pytest.mark.timeout(240)
@pytest.mark.parametrize("case", sorted(SIGKILL_CASES))
def test_nothing_ep_trl_started_outlives_a_sigkilled_trainer(
    case: str, tiny_model_dir: Path, tmp_path: Path, stdio_agent_config: Path
) -> None:
    env_path, marker = SIGKILL_CASES[case]
    port = SERVER_PORTS.get(case)
    assert port is None or not port_answers(port), f"port {port} is taken before the run: {port_holder(port)}"
    env = {**os.environ, "CALC_MCP_CONFIG": str(stdio_agent_config), "PYTHONPATH": CHILD_PYTHONPATH}
    trainer = subprocess.Popen(
        [sys.executable, "-m", "tests.support.killable_training", env_path, str(tiny_model_dir), str(tmp_path / "out")],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    output: list[str] = []
    assert trainer.stdout is not None
    try:
        for line in trainer.stdout:
            output.append(line)
            if line.strip() == "TRAINING":
                break
        deadline = time.monotonic() + 120
        while not [p for p in descendants(trainer.pid) if marker in command(p)]:  # the call is under way
            assert trainer.poll() is None and time.monotonic() < deadline, "".join(output)[-4000:]
            time.sleep(0.2)
        while port is not None and not port_answers(port):  # its server is up
            assert trainer.poll() is None and time.monotonic() < deadline, "".join(output)[-4000:]
            time.sleep(0.2)
        started = {p: command(p) for p in descendants(trainer.pid)}
        trainer.send_signal(signal.SIGKILL)
        trainer.wait(60)
    finally:
        if trainer.poll() is None:
            trainer.kill()
        output.append(trainer.stdout.read())
    assert [p for p, line in started.items() if marker in line], started
    deadline = time.monotonic() + GONE_WITHIN_S
    while [p for p in started if alive(p)] and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [f"{p.pid}: {line}" for p, line in started.items() if alive(p)]
    for p in started:
        if alive(p):
            p.kill()  # this test's leftovers, by pid: the next run finds its port free
    assert not left, left
    assert port is None or not port_answers(port)


# --- SIGTERM at chosen moments of real training -----------------------------------------------------------------

#: Where the main thread is when the signal is sent: the line the training process prints there
#: (tests/support/sigterm_training.py), and the window after it in which the signal is sent.
MOMENTS = {
    "mid-call": ("CALL {n} START", (0.0, 0.3)),  # episodes playing, the main thread waiting on the call
    "collecting": ("CALL {n} END", (0.0, 0.03)),  # TRL collecting the call's rollouts: rewards, tensors
    "between-calls": ("GC {n} END", (0.0, 0.1)),  # the trainer between two calls
    "gc": ("GC {n} START", (0.05, 0.3)),  # a collection running __del__ methods and weakref callbacks
}
#: Runs: every moment with every eval (8) in the main suite; scripts/test_openenv010.sh runs one per moment again
#: under OpenEnv's other distribution (EP_TRL_SIGTERM_RUNS=4).
RUNS = int(os.environ.get("EP_TRL_SIGTERM_RUNS", "8"))


@dataclass(frozen=True)
class Plan:
    case: str
    moment: str
    step: int
    delay_s: float


@dataclass(frozen=True)
class Outcome:
    plan: Plan
    status: int | None
    exit_s: float
    handlers_s: float  # until the last exit handler ran (inf: it did not run, as when ep_trl ended the process)
    dropped: bool  # Python dropped a raised Terminated ("Exception ignored in ...") before the process ended
    scored: tuple[str, ...]  # rollout ids TRL's reward function received: finished episodes with final rows queued
    not_final: tuple[str, ...]  # of those, ids whose final row is not in the ep logs store
    left: tuple[str, ...]  # processes the run started that are still alive
    output: str

    def ok(self) -> bool:
        return (
            self.status == 128 + signal.SIGTERM
            and self.exit_s <= EXIT_BOUND_S
            and min(self.handlers_s, self.exit_s) <= HANDLERS_BOUND_S
            and bool(self.scored)
            and not self.not_final
            and not self.left
        )

    def line(self) -> str:
        return (
            f"{self.plan.case:9} {self.plan.moment:13} step {self.plan.step} +{self.plan.delay_s:.2f}s: "
            f"status {self.status}, handlers {self.handlers_s:.1f}s, exit {self.exit_s:.1f}s, "
            f"dropped {self.dropped}, scored {len(self.scored)}, "
            f"rows missing {list(self.not_final)}, left {list(self.left)}"
        )


def final_rows_missing(log_home: Path, rollout_ids: list[str]) -> list[str]:
    from ep_trl.evalprotocol.store import StoreLogger

    store = StoreLogger(log_home / ".eval_protocol" / "logs.db")
    missing = []
    for rollout_id in rollout_ids:
        rows = store.read(rollout_id)
        if not rows or rows[-1].rollout_status.is_running():
            missing.append(rollout_id)
    return missing


def sigterm_training(plan: Plan, model_dir: Path, workdir: Path, mcp_config: Path) -> Outcome:
    env_path, _ = CASES[plan.case]
    tag = uuid.uuid4().hex
    workdir.mkdir(parents=True)
    env = {
        **child_environment(),
        "CALC_MCP_CONFIG": str(mcp_config),
        "PYTHONPATH": CHILD_PYTHONPATH,
        "EP_TRL_TEST_RUN": tag,
        GRACE_ENV: str(TRAINING_GRACE_S),
    }
    trainer = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.support.sigterm_training",
            env_path,
            str(model_dir),
            str(workdir / "out"),
            str(workdir / "home"),
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        assert trainer.stdout is not None  # a pipe (subprocess.PIPE)
        for line in trainer.stdout:
            lines.put(line)
        lines.put(None)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    output: list[str] = []
    target = MOMENTS[plan.moment][0].format(n=plan.step)
    status, exit_s, sent = None, float("inf"), math.inf
    try:
        deadline = time.monotonic() + 300  # start-up is about 20 s on an idle machine
        while not any(target in line for line in output[-1:]):
            try:
                line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no {target!r} within 300 s:\n" + "".join(output)[-4000:]) from None
            assert line is not None, f"the training process ended before {target!r}:\n" + "".join(output)[-4000:]
            output.append(line)
        time.sleep(plan.delay_s)
        trainer.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        try:
            status = trainer.wait(EXIT_BOUND_S + 20)
            exit_s = time.monotonic() - sent
        except subprocess.TimeoutExpired:
            pass
    finally:
        if trainer.poll() is None:
            trainer.kill()
            trainer.wait()
        reader.join(10)
    while not lines.empty():
        output.append(lines.get() or "")
    text = "".join(output)
    deadline = time.monotonic() + GONE_WITHIN_S
    while (left := processes_tagged(tag)) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid, _ in left:
        os.kill(pid, signal.SIGKILL)
    scored = re.findall(r"SCORED (rollout-[0-9a-f]{12})", text)
    handlers_done = re.search(r"^EXIT HANDLERS DONE ([0-9.]+)$", text, flags=re.M)
    return Outcome(
        plan=plan,
        status=status,
        exit_s=exit_s,
        handlers_s=float(handlers_done.group(1)) - sent if handlers_done and status is not None else math.inf,
        dropped=bool(DROPPED.search(main_thread_text(text))),
        scored=tuple(scored),
        not_final=tuple(final_rows_missing(workdir / "home", scored)),
        left=tuple(f"{pid}: {cmd[:200]}" for pid, cmd in left),
        output=text,
    )


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_sigterm_ends_training_every_time(
    tiny_model_dir: Path, qwen_template_model_dir: Path, stdio_agent_config: Path, tmp_path: Path
) -> None:
    """Each moment with each eval once, at a chosen point of the moment's window (a quarter into it with the Docker
    eval, three quarters with the stdio MCP one), step 2: 8 runs where 20 random ones cost 321 s of CI and
    covered the same moments and evals (issue 40). The Docker eval's come first, so EP_TRL_SIGTERM_RUNS=4
    (scripts/test_openenv010.sh) runs each moment once on it."""
    models = {"docker": tiny_model_dir, "stdio_mcp": qwen_template_model_dir}
    runs = [
        Plan(case=case, moment=moment, step=2, delay_s=round(low + (high - low) * (1 + 2 * k) / 4, 3))
        for k, case in enumerate(sorted(CASES))
        for moment, (_, (low, high)) in MOMENTS.items()
    ][:RUNS]
    with ThreadPoolExecutor(max_workers=2) as pool:  # two at a time: the machine has two cores
        outcomes = list(
            pool.map(
                lambda k: sigterm_training(runs[k], models[runs[k].case], tmp_path / f"run{k}", stdio_agent_config),
                range(len(runs)),
            )
        )
    report = "\n".join(outcome.line() for outcome in outcomes)
    print(report)
    failed = [outcome for outcome in outcomes if not outcome.ok()]
    assert not failed, report + "\n\nfirst failed run's output:\n" + failed[0].output[-6000:]
    assert len(outcomes) == min(RUNS, len(MOMENTS) * len(CASES)) >= len(MOMENTS), report
    assert {o.plan.moment for o in outcomes} == set(MOMENTS), report
    # the case issue 24 found: the first raise was dropped inside a finalizer, and the process still ended
    assert any(outcome.dropped for outcome in outcomes if outcome.plan.moment == "gc"), report


# --- each way the first raise can be lost, on a small program -----------------------------------------------------

PRELUDE = """
import gc, os, signal, sys, time
from ep_trl.runtime import shutdown

signal.signal(signal.SIGINT, signal.default_int_handler)  # Python's own, whatever this process inherited

class Resource:
    def close(self):
        print("CLOSED", flush=True)

resource = Resource()
shutdown.register(resource)  # as a rollout function registers itself: ep_trl's SIGTERM handler is now in place

class SignalsInFinalizer:
    \"\"\"Sends a signal from its ``__del__`` and runs on there, so the handler runs where Python drops
    exceptions.\"\"\"
    def __init__(self, signum):
        self.signum, self.cycle = signum, self

    def __del__(self):
        os.kill(os.getpid(), self.signum)
        for _ in range(200000):
            pass
"""


def run_program(
    body: str, timeout: float = 60, grace: str | None = None, before: str = ""
) -> tuple[subprocess.CompletedProcess, float]:
    """``body`` after the prelude in a fresh interpreter; ``grace``: its ``EP_TRL_STOP_GRACE_S`` (None: unset);
    ``before``: code run before the prelude imports ep_trl."""
    env = {k: v for k, v in child_environment().items() if k != GRACE_ENV}
    env.update({"PYTHONPATH": CHILD_PYTHONPATH, **({GRACE_ENV: grace} if grace is not None else {})})
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-c", before + PRELUDE + textwrap.dedent(body)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    return result, time.monotonic() - started


def lines(output: str) -> list[str]:
    """The program's lines, less the ``SENT <time>`` one of :func:`since_sent`."""
    return [line for line in output.splitlines() if line and not line.startswith("SENT ")]


#: Put before the program's ``os.kill(..., SIGTERM)``: the time it was sent (its interpreter start-up, seconds on a
#: loaded machine, is no part of what is measured).
SEND = 'print("SENT", time.time(), flush=True)'


def since_sent(result: subprocess.CompletedProcess) -> float:
    """Seconds from the program's SIGTERM to now (call it right after the program ended)."""
    sent = [float(line.split()[1]) for line in result.stdout.splitlines() if line.startswith("SENT ")]
    assert len(sent) == 1, result.stdout
    return time.time() - sent[0]


def test_a_log_line_another_thread_wrote_inside_a_traceback_line_is_read_past() -> None:
    """Issue 48: CI failed on correct code, status 143 as required, because the signal watcher's warning had landed
    inside the program's own ``RuntimeError`` line. The checks read the interpreter's lines through a log line
    (this one as it came), and what is not there is still not found."""
    warning = (
        "ep_trl: SIGTERM received; closing rollouts and the environment servers ep_trl started, then exiting "
        "with status 143 (ending it 25 s from now at the latest: the stop grace, RolloutOptions(stop_grace_s="
        "...) or EP_TRL_STOP_GRACE_S)\n"
    )
    error = "RuntimeError: cannot release un-acquired lock"
    split = (
        'Traceback (most recent call last):\n  File "<string>", line 32, in <module>\nRuntimeError'
        + warning
        + (": cannot release un-acquired lock\n")
    )
    assert error not in split and error in main_thread_text(split)
    dropped = (
        "Exception ignored in: <function SignalsInFinalizer.__del__ at 0x7f3c>\nTraceback (most recent call "
        'last):\n  File "<string>", line 22, in __del__\nep_trl.runtime.shutdown.Terminated: ' + warning + "143\n"
    )
    assert not DROPPED.search(dropped) and DROPPED.search(main_thread_text(dropped))
    assert error not in main_thread_text(warning + "RuntimeError: another error\n" + warning)


def test_a_sigterm_python_drops_in_a_finalizer_is_delivered_again() -> None:
    result, _ = run_program("""
        SignalsInFinalizer(signal.SIGTERM)
        gc.collect()
        started = time.monotonic()
        time.sleep(20)
        print("SURVIVED", flush=True)
    """)
    printed = main_thread_text(result.stderr)
    assert "Exception ignored in" in printed and "Terminated: 143" in printed, result.stderr
    assert result.returncode == 143 and "SURVIVED" not in result.stdout, (result.stdout, result.stderr[-3000:])
    assert "CLOSED" in result.stdout
    assert "delivering the signal again" in result.stderr


#: Registered before the prelude imports ep_trl, so it runs after ep_trl's exit handler, and lets the watcher go.
LAST_EXIT_HANDLER = """
import atexit, threading, time

watcher_goes = threading.Event()

def after_ep_trl_s_exit_handler():
    watcher_goes.set()
    time.sleep(2)  # the watcher acts now, at the latest
    print("LAST EXIT HANDLER DONE", flush=True)

atexit.register(after_ep_trl_s_exit_handler)
"""


def test_a_dropped_sigterm_delivered_late_does_not_change_the_exit_status() -> None:
    """A SIGTERM that Python drops in a finalizer, after which the main thread ends by itself (the next rollout call's
    check raises), while the signal watcher, on a loaded machine, gets to deliver the signal again only once ep_trl's
    exit handler has closed everything and put SIGTERM's default back (the hold on the watcher stands in for the
    scheduler). It must not deliver it then: the process would end by the signal (status -15 to a parent) instead of
    with ep_trl's 143 (seen once in 20 runs of the every-moment test under load, issue 48)."""
    result, _ = run_program(
        """
        deliver_again = shutdown._state._deliver_again

        def late(signum):
            watcher_goes.wait()
            return deliver_again(signum)

        shutdown._state._deliver_again = late
        SignalsInFinalizer(signal.SIGTERM)
        gc.collect()
        print("GOES ON", flush=True)
        shutdown.raise_if_terminating()  # what the next rollout call does first
    """,
        before=LAST_EXIT_HANDLER,
    )
    assert result.returncode == 143, (result.returncode, result.stdout, result.stderr[-3000:])
    assert result.stdout.split() == ["GOES", "ON", "CLOSED", "LAST", "EXIT", "HANDLER", "DONE"], result.stdout
    assert "the exit is under way" in result.stderr and "delivering the signal again" not in result.stderr


def test_a_ctrl_c_python_drops_in_a_finalizer_is_raised_again() -> None:
    result, _ = run_program("""
        try:
            SignalsInFinalizer(signal.SIGINT)
            gc.collect()
            time.sleep(20)
            print("SURVIVED", flush=True)
        except KeyboardInterrupt:
            print("INTERRUPTED", flush=True)
    """)
    printed = main_thread_text(result.stderr)
    assert "Exception ignored in" in printed and "KeyboardInterrupt" in printed, result.stderr
    assert "INTERRUPTED" in result.stdout and "SURVIVED" not in result.stdout, (result.stdout, result.stderr[-3000:])
    assert result.returncode == 0


def test_a_swallowed_sigterm_stops_the_next_rollout_call() -> None:
    result, _ = run_program(f"""
        try:
            {SEND}
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        except BaseException:  # library code that swallows everything
            print("SWALLOWED", flush=True)
        shutdown.raise_if_terminating()  # what every rollout call does first
        print("CALL STARTED", flush=True)
    """)
    assert "SWALLOWED" in result.stdout and "CALL STARTED" not in result.stdout, result.stdout
    assert result.returncode == 143 and "CLOSED" in result.stdout, result.stderr[-3000:]
    assert "did not exit within" not in result.stderr  # the process ended by itself; the grace was not needed
    assert since_sent(result) < 10


def test_a_sigterm_whose_exit_a_failing_cleanup_replaced_still_exits_with_143() -> None:
    """Seen in the SIGTERM test: the signal landed while tqdm took its lock, tqdm's ``finally`` then released a lock
    it never took, and that ``RuntimeError`` replaced ``Terminated``: status 1, not 143."""
    result, _ = run_program(f"""
        try:
            {SEND}
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(20)
            print("SURVIVED", flush=True)
        finally:  # a library's cleanup that fails while the signal's exit unwinds through it
            raise RuntimeError("cannot release un-acquired lock")
    """)
    assert "SURVIVED" not in result.stdout and "CLOSED" in result.stdout, result.stderr[-3000:]
    # the program's own error is shown
    assert "RuntimeError: cannot release un-acquired lock" in main_thread_text(result.stderr), result.stderr[-3000:]
    assert result.returncode == 143, result.stderr[-3000:]
    assert since_sent(result) < 10


@pytest.mark.parametrize("cleanup", ["replaces it", "lets it through"])
def test_a_close_that_fails_at_a_sigterms_exit_is_reported_and_the_status_stays_143(cleanup: str) -> None:
    """Issue 40: a registered resource whose close raised at the exit made the close re-raise before the status was
    restored: with a cleanup that replaced ``Terminated`` the process ended with status 1."""
    replace = 'raise RuntimeError("cannot release un-acquired lock")' if cleanup == "replaces it" else "pass"
    result, _ = run_program(f"""
        class FailsToClose:  # a resource whose close fails at the exit
            def close(self):
                raise OSError("the disk is gone")

            def __repr__(self):
                return "FailsToClose"

        fails = FailsToClose()
        shutdown.register(fails)  # registered after the prelude's resource: closed first
        try:
            {SEND}
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(20)
            print("SURVIVED", flush=True)
        finally:
            {replace}
    """)
    assert lines(result.stdout) == ["CLOSED"], (result.stdout, result.stderr[-3000:])  # the others closed still
    assert "ep_trl: closing FailsToClose failed" in result.stderr, result.stderr[-3000:]
    assert "OSError: the disk is gone" in main_thread_text(result.stderr), result.stderr[-3000:]
    assert result.returncode == 143, result.stderr[-3000:]
    assert "did not exit within" not in result.stderr
    assert since_sent(result) < 10


@pytest.mark.parametrize("cleanup", ["lets it through", "replaces it"])
def test_which_exit_handlers_run_at_a_sigterms_exit_is_as_the_docs_say(cleanup: str) -> None:
    """docs/failures.md (issue 48): through the ordinary unwinding every exit handler runs; when a cleanup replaced
    ``Terminated``, ep_trl's ``os._exit(143)`` skips the handlers registered before ``ep_trl.runtime.shutdown`` was
    imported (the docs said "the other exit handlers still run")."""
    replace = 'raise RuntimeError("cannot release un-acquired lock")' if cleanup == "replaces it" else "pass"
    program = textwrap.dedent(f"""
        import atexit, os, signal, time
        atexit.register(print, "REGISTERED BEFORE", flush=True)
        from ep_trl.runtime import shutdown
        atexit.register(print, "REGISTERED AFTER", flush=True)

        class Resource:
            def close(self):
                print("CLOSED", flush=True)

        resource = Resource()
        shutdown.register(resource)
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(20)
            print("SURVIVED", flush=True)
        finally:
            {replace}
    """)
    result = subprocess.run(
        [sys.executable, "-c", program],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={**child_environment(), "PYTHONPATH": CHILD_PYTHONPATH},
    )
    ran = ["REGISTERED AFTER", "CLOSED"] + (["REGISTERED BEFORE"] if cleanup == "lets it through" else [])
    assert lines(result.stdout) == ran, (result.stdout, result.stderr[-3000:])
    assert result.returncode == 143, result.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_12_s_cleanup_in_finally_finishes_within_the_default_grace() -> None:
    """Issue 33: a program whose ``finally`` saves a checkpoint for 12 s was killed at 9 s, and ep_trl closed its
    resources at 4 s while that ``finally`` still ran."""
    result, _ = run_program(f"""
        try:
            {SEND}
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(60)
            print("SURVIVED", flush=True)
        finally:  # the program's own cleanup: a checkpoint that takes 12 s to save
            for _ in range(12):
                time.sleep(1)
            print("SAVED", flush=True)
    """)
    seconds = since_sent(result)
    assert lines(result.stdout) == ["SAVED", "CLOSED"], result.stderr[-3000:]  # ep_trl closed after it, not during
    assert result.returncode == 143, result.stderr[-3000:]
    assert "did not exit within" not in result.stderr
    assert 12 <= seconds < 12 + 10


def test_a_swallowed_sigterm_ends_the_process_when_the_grace_ends_its_rows_written_and_no_call_started(
    tmp_path: Path,
) -> None:
    """The grace from EP_TRL_STOP_GRACE_S; before the forced exit the ep logs rows still queued are written though a
    close hangs, and once ep_trl has closed, a rollout call that starts anyway gets a clear error."""
    store = tmp_path / "logs.db"
    result, _ = run_program(
        f"""
        from ep_trl import evalprotocol
        from ep_trl.evalprotocol import StoreLogger
        from ep_trl.traininglog.writer import RolloutLogWriter
        from ep_trl.runtime.runner import LoopRunner

        class Hangs:  # a close that never returns (a server that ignores its stop, say)
            def close(self):
                print("HANGING", flush=True)
                time.sleep(600)

        class Function:  # a rollout function's event loop, closed with it
            def __init__(self):
                self.runner, self.closed = LoopRunner(), False

            def close(self):
                self.runner.close()
                self.closed = True

        async def call():
            return "CALL RAN"

        hangs = Hangs()
        shutdown.register(hangs)
        function = Function()
        shutdown.register(function)  # newer: closed before Hangs
        print(function.runner.run(call()), flush=True)
        writer = RolloutLogWriter(StoreLogger({str(store)!r}), min_interval_s=600)  # rows wait in the queue
        row = evalprotocol.build_row(
            messages=[{{"role": "user", "content": "hi"}}], eval_name="test_x", row_id="prompt-1",
            rollout_id="rollout-1", invocation_id="inv", experiment_id="inv-step0", run_id="step-0",
            completion_params={{"model": "m"}}, extra={{}})
        writer.log("rollout-1", lambda: row)
        try:
            {SEND}
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        except BaseException:
            print("SWALLOWED", flush=True)
        while not function.closed:  # training that never calls the rollout function again, until ep_trl closed it
            time.sleep(0.05)
        for start in (shutdown.raise_if_terminating, lambda: function.runner.run(call())):  # a call all the same
            try:
                print("STARTED", start(), flush=True)
            except Exception as error:
                print("REFUSED", type(error).__name__, flush=True)
        time.sleep(60)
        print("SURVIVED", flush=True)
    """,
        grace="4",
    )
    seconds = since_sent(result)
    out = lines(result.stdout)
    assert out[:2] == ["CALL RAN", "SWALLOWED"] and "SURVIVED" not in out, (out, result.stderr[-3000:])
    assert out.count("REFUSED ProcessExitingError") == 2 and "HANGING" in out, out
    assert "has closed its rollout functions" not in main_thread_text(result.stderr)  # refused, not crashed there
    assert result.returncode == 143, result.stderr[-3000:]
    assert "did not exit within 4 s of SIGTERM" in result.stderr
    from ep_trl.evalprotocol import StoreLogger

    assert [r.execution_metadata.rollout_id for r in StoreLogger(store).read("rollout-1")] == ["rollout-1"]
    assert 4 <= seconds < 4 + 5


def test_a_program_with_its_own_sigterm_handler_keeps_it() -> None:
    result, _ = run_program(
        """
        assert shutdown.handle_sigterm() is True  # register() above installed ep_trl's handler; the program's own wins
        signal.signal(signal.SIGTERM, lambda signum, frame: print("OWN HANDLER", flush=True))
        assert shutdown.handle_sigterm() is False
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(3)  # past the grace: ep_trl's deadline is not armed by a signal it did not handle
        print("WENT ON", flush=True)
    """,
        grace="2",
    )
    assert result.stdout.split() == ["OWN", "HANDLER", "WENT", "ON", "CLOSED"], (result.stdout, result.stderr)
    assert result.returncode == 0


def test_the_stop_grace_is_the_options_else_the_environment_variables_else_25_s(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from ep_trl import RolloutOptions, create_openenv_vllm_rollout_func
    from ep_trl.errors import ConfigError

    servers = Closes()
    monkeypatch.setenv(GRACE_ENV, "soon")
    with pytest.raises(ConfigError, match=f"{GRACE_ENV}='soon'.*seconds > 0"):
        shutdown.register(servers)  # refused when the resource is made, not when a SIGTERM comes
    monkeypatch.setenv(GRACE_ENV, "12.5")
    shutdown.register(servers)
    try:
        assert shutdown.current_grace_s() == 12.5
        rollout = create_openenv_vllm_rollout_func(
            "tests.evals.eval_letters::test_letters_pointwise", options=RolloutOptions(stop_grace_s=40)
        )
        try:
            assert shutdown.current_grace_s() == 40
        finally:
            rollout.close()
    finally:
        shutdown.unregister(servers)
    assert grace.DEFAULT_STOP_GRACE_S == 25  # the default, within Kubernetes' and Slurm's 30 s


class Closes:
    """A registered resource that records when it is closed, and what was still registered then."""

    def __init__(self, name: str = "", record: list | None = None, raises: BaseException | None = None) -> None:
        self.name, self.record, self.raises = name, record if record is not None else [], raises

    def close(self) -> None:
        self.record.append((self.name, sorted(r.name for r in shutdown._registered.values() if isinstance(r, Closes))))
        if self.raises is not None:
            raise self.raises

    def __repr__(self) -> str:
        return self.name


def test_every_registered_resource_is_closed_when_one_fails(caplog: pytest.LogCaptureFixture) -> None:
    closed: list[tuple[str, list[str]]] = []
    resources = [
        Closes("servers", closed, OSError("servers failed")),
        Closes("log", closed),
        Closes("rollout function", closed, OSError("rollout function failed")),
        Closes("closed already"),
    ]
    for resource in resources:
        shutdown.register(resource)
    shutdown.unregister(resources[-1])
    with pytest.raises(ExceptionGroup) as raised:
        shutdown.close_all()
    assert [name for name, _ in closed] == ["rollout function", "log", "servers"]
    assert [str(error) for error in raised.value.exceptions] == ["rollout function failed", "servers failed"]
    assert "closing rollout function failed" in caplog.text and "closing servers failed" in caplog.text
    shutdown.close_all()
    assert len(closed) == 3


def test_a_resource_stays_registered_until_its_close_ran_and_an_interrupted_close_skips_none() -> None:
    """Issue 33: close_all dropped its registry before closing, and a KeyboardInterrupt from one close skipped the
    rest."""
    closed: list[tuple[str, list[str]]] = []
    resources = [Closes("servers", closed), Closes("log", closed, KeyboardInterrupt()), Closes("rollout", closed)]
    for resource in resources:
        shutdown.register(resource)
    with pytest.raises(KeyboardInterrupt):
        shutdown.close_all()
    assert closed == [("rollout", ["log", "rollout", "servers"]), ("log", ["log", "servers"]), ("servers", ["servers"])]
    assert not [r for r in shutdown._registered.values() if r in resources]


def test_the_signal_handler_and_unraisable_hook_are_given_back_once_everything_is_closed() -> None:
    """A notebook that trains, closes, and trains again: between the two, the process is as before the first; the
    second run's SIGTERM handling works as the first's (here: a raise dropped in a finalizer is delivered again)."""
    result, _ = run_program("""
        installed = (signal.getsignal(signal.SIGTERM) is shutdown._on_sigterm,
                     sys.unraisablehook is shutdown._on_unraisable)
        print("INSTALLED", installed, flush=True)
        shutdown.unregister(resource)  # the first training's rollout function closed
        print("GIVEN BACK", (signal.getsignal(signal.SIGTERM) is signal.SIG_DFL,
                             sys.unraisablehook is sys.__unraisablehook__), flush=True)
        again = Resource()
        shutdown.register(again)  # the second training
        print("INSTALLED", (signal.getsignal(signal.SIGTERM) is shutdown._on_sigterm,
                            sys.unraisablehook is shutdown._on_unraisable), flush=True)
        SignalsInFinalizer(signal.SIGTERM)
        gc.collect()
        time.sleep(20)
        print("SURVIVED", flush=True)
    """)
    assert lines(result.stdout) == [
        "INSTALLED (True, True)",
        "GIVEN BACK (True, True)",
        "INSTALLED (True, True)",
        "CLOSED",
    ], (result.stdout, result.stderr[-3000:])
    assert result.returncode == 143 and "delivering the signal again" in result.stderr, result.stderr[-3000:]


# --- a fork owns nothing of its parent ----------------------------------------------------------------------------

SERVER_PRELUDE = """
import urllib.request
from ep_trl.openenv.servers import LaunchedServers
from ep_trl.openenv.local_provider import LocalAppProvider

provider = LocalAppProvider("tests.fixtures.guess_env.server.app:app")  # a real environment server, as ep_trl starts
servers = LaunchedServers()
url = provider.start()
servers.add(None, url, provider, provider.stop)

def answers():
    try:
        with urllib.request.urlopen(url + "/health", timeout=10) as reply:
            return reply.status
    except OSError as error:
        return type(error).__name__
"""


@pytest.mark.timeout(180)
def test_a_forked_child_that_exits_leaves_its_parents_servers_and_rows_alone(tmp_path: Path) -> None:
    """Issue 33: the child's exit ran its parent's close(): it killed the parent's servers' process group (its
    ``poll()`` cannot see them) and waited on the parent's log writer thread. Whether the child closes the parent's
    writer is seen directly: the program's writer says when it is closed in another process. (The child's exit was
    timed against 5 s instead; under a load of twice the cores a correct child once took longer, and the test failed
    on correct code: ``benchmarks/results/shutdown_rest_repeated.json``.)"""
    result, _ = run_program(
        SERVER_PRELUDE
        + textwrap.dedent(f"""
        from ep_trl.evalprotocol import StoreLogger
        from ep_trl.traininglog.writer import RolloutLogWriter

        writer = RolloutLogWriter(StoreLogger({str(tmp_path / "logs.db")!r}))  # a rollout function's, with its thread
        parent, close = os.getpid(), RolloutLogWriter.close

        def said_close(self):
            if os.getpid() != parent:
                print("THE WRITER CLOSED IN THE CHILD", flush=True)
            close(self)

        RolloutLogWriter.close = said_close
        child = os.fork()
        if child == 0:
            sys.exit(0)  # a normal exit: the child's exit handlers run
        print("CHILD EXIT STATUS", os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]), flush=True)
        print("SERVER", answers(), flush=True)
        servers.close()
        writer.close()
        print("SERVER AFTER ITS CLOSE", answers(), flush=True)
    """),
        timeout=150,
    )
    assert lines(result.stdout) == [
        "CHILD EXIT STATUS 0",
        "SERVER 200",
        "SERVER AFTER ITS CLOSE URLError",
        "CLOSED",
    ], (result.stdout, result.stderr[-3000:])  # CLOSED once: by the parent
    assert result.returncode == 0


def test_a_child_forked_while_the_watcher_holds_its_lock_still_exits() -> None:
    """The watcher holds a lock from its check to its signal, which the exit handler takes too: a child forked in
    between gets a lock of its own, or its exit would wait forever."""
    result, _ = run_program("""
        import threading
        held, fork_done = threading.Event(), threading.Event()

        def watcher_like():
            with shutdown._state.redelivery:
                held.set()
                fork_done.wait()

        threading.Thread(target=watcher_like, daemon=True).start()
        held.wait()
        child = os.fork()
        if child == 0:
            sys.exit(0)  # its exit handlers run, ep_trl's among them
        fork_done.set()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and os.waitpid(child, os.WNOHANG) == (0, 0):
            time.sleep(0.05)
        print("CHILD ENDED" if time.monotonic() < deadline else "CHILD HANGS", flush=True)
        if time.monotonic() >= deadline:
            os.kill(child, signal.SIGKILL)
    """)
    assert lines(result.stdout) == ["CHILD ENDED", "CLOSED"], (result.stdout, result.stderr[-3000:])


@pytest.mark.timeout(180)
def test_a_fork_context_worker_closes_only_what_it_registered() -> None:
    """A multiprocessing worker forked from the trainer registers its own resource; SIGTERM'd and swallowing it, it
    is closed and ended by its grace, closing its own resource only."""
    result, _ = run_program(
        SERVER_PRELUDE
        + textwrap.dedent("""
        import multiprocessing

        class Own:  # the worker's own rollout function
            def close(self):
                print("WORKER CLOSED ITS OWN", flush=True)

        def work():
            own = Own()
            shutdown.register(own)
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)
            except BaseException:
                print("WORKER SWALLOWED", flush=True)
            while True:  # works on without a rollout call: closed and ended when its grace ends
                time.sleep(0.05)

        worker = multiprocessing.get_context("fork").Process(target=work)
        worker.start()
        worker.join(60)
        print("WORKER EXIT", worker.exitcode, flush=True)
        print("SERVER", answers(), flush=True)
        servers.close()
    """),
        timeout=150,
        grace="2",
    )
    assert lines(result.stdout) == [
        "WORKER SWALLOWED",
        "WORKER CLOSED ITS OWN",
        "WORKER EXIT 143",
        "SERVER 200",
        "CLOSED",
    ], (result.stdout, result.stderr[-3000:])
