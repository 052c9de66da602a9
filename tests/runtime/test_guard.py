"""ep_trl/runtime/guard.py, the watchdog every process ep_trl starts runs under: the command ends with its parent
however the parent ends, signals reach it, its status is the guard's, its last stderr lines are kept."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from ep_trl.runtime.guard import EXIT_MARK, KEPT_LINES, KILL_AFTER_S
from ep_trl.runtime.processes import GUARD


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def guarded(*command: str, log: Path | None = None, **popen: Any) -> subprocess.Popen:
    extra = ["--stderr-log", str(log)] if log else []
    return subprocess.Popen([sys.executable, str(GUARD), "--parent", str(os.getpid()), *extra, "--", *command], **popen)


def command_pid(guard: subprocess.Popen) -> int:
    deadline = time.monotonic() + 10
    while not psutil.Process(guard.pid).children():
        assert time.monotonic() < deadline, "the guard started no command"
        time.sleep(0.02)
    return psutil.Process(guard.pid).children()[0].pid


def test_the_command_ends_when_its_parent_is_killed(tmp_path: Path) -> None:
    """A parent killed with SIGKILL runs no cleanup: the guard notices it is gone and ends the command."""
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import os, subprocess, sys, time\n"
                f"g = subprocess.Popen([sys.executable, {str(GUARD)!r}, '--parent', str(os.getpid()), '--', 'sleep', "
                "'300'])\n"
                "print(g.pid, flush=True)\n"
                "time.sleep(300)\n"
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert parent.stdout is not None
    try:
        guard_pid = int(parent.stdout.readline())
        deadline = time.monotonic() + 10
        while not psutil.Process(guard_pid).children():
            assert time.monotonic() < deadline
            time.sleep(0.02)
        [sleeper] = psutil.Process(guard_pid).children()
        parent.kill()
        parent.wait()
        assert wait_gone(sleeper.pid, 3.0) and wait_gone(guard_pid, 3.0)
    finally:
        parent.kill()


def test_signals_reach_the_command_and_its_status_is_the_guards() -> None:
    guard = guarded(sys.executable, "-c", "import sys, time; time.sleep(300)")
    pid = command_pid(guard)
    guard.send_signal(signal.SIGTERM)
    assert guard.wait(10) == 128 + signal.SIGTERM and not alive(pid)
    assert guarded(sys.executable, "-c", "raise SystemExit(7)").wait(10) == 7


def test_the_last_stderr_lines_and_the_status_are_kept(tmp_path: Path) -> None:
    log = tmp_path / "server.stderr"
    script = "import sys\nfor k in range(100):\n    print(f'line {k}', file=sys.stderr)\nraise SystemExit(3)"
    guard = guarded(sys.executable, "-c", script, log=log, stderr=subprocess.PIPE)
    _, passed_on = guard.communicate(timeout=10)
    assert guard.returncode == 3
    lines = log.read_text().splitlines()
    assert lines[-1] == f"{EXIT_MARK} 3" and len(lines) == KEPT_LINES + 1
    assert lines[-2] == "line 99" and lines[0] == f"line {100 - KEPT_LINES}"
    assert passed_on.decode().count("line ") == 100  # the console still sees every line


def test_stdin_and_stdout_belong_to_the_command() -> None:
    """A stdio MCP client talks to the command through the guard's stdin/stdout and sees EOF when the command ends."""
    guard = guarded(
        sys.executable,
        "-c",
        "import sys; print(sys.stdin.readline().upper(), end='')",
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    out, _ = guard.communicate("ping\n", timeout=10)
    assert out == "PING\n" and guard.returncode == 0


@pytest.mark.parametrize("argv", [["--parent", "1"], ["--parent", "1", "--"]])
def test_a_guard_without_a_command_is_refused(argv: list[str]) -> None:
    result = subprocess.run([sys.executable, str(GUARD), *argv], capture_output=True, text=True, timeout=10)
    assert result.returncode == 2 and "no command" in result.stderr


# --- --adopt: a process someone else started (eval-protocol's MCP-gym server) ------------------------------------


def adopting(pid: int, **popen: Any) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(GUARD), "--parent", str(os.getpid()), "--adopt", str(pid)], **popen)


def test_an_adopted_process_and_its_descendants_end_when_the_parent_is_killed() -> None:
    """The parent starts a server itself, in its own process group (as eval-protocol's MCPServerManager does), the
    server starts a helper that ignores SIGTERM, and the parent hands the server's pid to a guard. SIGKILLed, the
    parent runs no cleanup: the guard ends the server at once and the helper with SIGKILL after KILL_AFTER_S."""
    server = (
        "import signal, subprocess, sys, time\n"
        "helper = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
        "signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); time.sleep(300)'], "
        "stdout=subprocess.PIPE)\n"
        "helper.stdout.readline()\n"
        "print(helper.pid, flush=True)\n"
        "time.sleep(300)\n"
    )
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import os, subprocess, sys, time\n"
                f"server = subprocess.Popen([sys.executable, '-c', {server!r}], stdout=subprocess.PIPE, text=True)\n"
                "helper = int(server.stdout.readline())\n"
                f"g = subprocess.Popen([sys.executable, {str(GUARD)!r}, '--parent', str(os.getpid()), '--adopt', "
                "str(server.pid)])\n"
                "print(server.pid, helper, g.pid, flush=True)\n"
                "time.sleep(300)\n"
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    started: list[int] = []
    assert parent.stdout is not None
    try:
        started = list(map(int, parent.stdout.readline().split()))
        server_pid, helper_pid, guard_pid = started
        assert psutil.Process(server_pid).ppid() == parent.pid and os.getpgid(server_pid) == os.getpgid(parent.pid)
        time.sleep(0.5)  # the guard is watching
        assert alive(server_pid) and alive(helper_pid) and alive(guard_pid)
        killed = time.monotonic()
        parent.kill()
        parent.wait()
        assert wait_gone(server_pid, 3.0), "the adopted server outlived its SIGKILLed parent"
        assert alive(helper_pid)  # it ignores SIGTERM: SIGKILL comes KILL_AFTER_S later
        assert wait_gone(helper_pid, KILL_AFTER_S + 3.0) and wait_gone(guard_pid, 3.0)
        assert time.monotonic() - killed >= KILL_AFTER_S
    finally:
        parent.kill()
        for pid in started:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_the_guard_of_an_adopted_process_leaves_when_the_process_ends_by_itself() -> None:
    server = subprocess.Popen(["sleep", "300"])
    guard = adopting(server.pid)
    try:
        time.sleep(0.6)
        assert server.poll() is None and guard.poll() is None  # the guard watches; it does not end a live parent's
        server.terminate()
        server.wait(10)
        assert guard.wait(3) == 0
    finally:
        server.kill()
        guard.kill()


def test_a_signalled_adopting_guard_ends_its_process() -> None:
    """The guard stands for the process it adopted, as a command guard forwards its signals to the command."""
    server = subprocess.Popen(["sleep", "300"])
    guard = adopting(server.pid)
    try:
        time.sleep(0.5)
        guard.send_signal(signal.SIGTERM)
        assert guard.wait(10) == 0
        assert server.wait(3) == -signal.SIGTERM
    finally:
        server.kill()
        guard.kill()


def test_an_adopted_pid_that_is_gone_ends_the_guard_at_once() -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    assert adopting(gone.pid).wait(5) == 0


@pytest.mark.parametrize("argv", [["--adopt", "1", "--", "sleep", "1"], ["--adopt", "1", "--stderr-log", "x"]])
def test_an_adopting_guard_with_a_command_is_refused(argv: list[str]) -> None:
    result = subprocess.run(
        [sys.executable, str(GUARD), "--parent", "1", *argv], capture_output=True, text=True, timeout=10
    )
    assert result.returncode == 2 and "--adopt PID watches a running process" in result.stderr
