"""The watchdog between ep_trl and every process it starts: the command ends when the process that started it ends,
however that process ends.

    python /path/to/ep_trl/runtime/guard.py --parent PID [--stderr-log FILE] -- COMMAND [ARG ...]
    python /path/to/ep_trl/runtime/guard.py --parent PID --adopt SERVER_PID

``ep_trl.runtime.processes`` starts environment servers through it and ``ep_trl.evalprotocol.mcp_servers`` the stdio MCP
servers of an agent eval. It is run by path and uses only the standard library, so it starts in a few tens of
milliseconds without importing ep_trl (or torch). It

* leads a process group of its own, in which the command runs, so stopping the group stops whatever the command
  started too;
* forwards SIGTERM, SIGINT and SIGHUP to the command (one that comes while the command starts, once it has) and exits
  with the command's status;
* watches its parent: when the process that started it is gone (killed with SIGKILL, crashed), the guard is handed
  to another parent, and it terminates the command (SIGTERM, SIGKILL after ``KILL_AFTER_S``) within
  ``POLL_S``. Why not Linux's parent-death signal alone: it follows the *thread* that started the child, so a
  server started from a short-lived thread would die with that thread; and it is Linux only. Polling the parent's
  pid works on any POSIX system;
* with ``--stderr-log``, passes the command's stderr on to its own and keeps the last ``KEPT_LINES`` lines in FILE,
  then a last line ``EXIT_MARK <status>``, so an error can say why a server died (its own words, its exit status).

``--adopt`` watches a process that someone else started instead of starting one: a server that eval-protocol's
``MCPServerManager`` starts with ``subprocess.Popen`` from the trainer (``ep_trl.evalprotocol.mcp_servers``). That
process is the trainer's child, in the trainer's process group, so it cannot be moved into this guard's group; the guard
takes the process and its descendants by pid instead. When its parent is gone, or it gets SIGTERM, SIGINT or SIGHUP, it
terminates them (SIGTERM, SIGKILL after ``KILL_AFTER_S``); it exits as soon as the adopted process ends by itself. On
Linux it tells the adopted process by its pid and start time (a pid reused by another process is never signalled) and
finds the descendants in ``/proc``; elsewhere it signals the pid alone. It still leads a group of its own, so a Ctrl-C
to the trainer's terminal (which a notebook survives) does not reach it.
"""

import argparse
import collections
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

#: How often the parent's pid is checked, and how long the command gets between SIGTERM and SIGKILL.
POLL_S = 0.2
KILL_AFTER_S = 5.0
#: stderr lines kept in the log, and the prefix of its last line.
KEPT_LINES = 40
EXIT_MARK = "[ep_trl guard] exit status"
#: The signals a guard passes on to its command (or that end the process it adopted).
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="guard.py", description=__doc__.splitlines()[0])
    parser.add_argument("--parent", type=int, required=True, help="pid of the process that started this guard")
    parser.add_argument("--stderr-log", type=Path, default=None, help="keep the command's last stderr lines here")
    parser.add_argument(
        "--adopt",
        type=int,
        default=None,
        metavar="PID",
        help="watch this running process (started by someone else) instead of starting a command",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARG ...]")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.adopt is not None and (command or args.stderr_log):
        parser.error("--adopt PID watches a running process: give no command and no --stderr-log with it")
    if args.adopt is None and not command:
        parser.error("no command given after -- (or a process to watch: --adopt PID)")
    if os.getpgrp() != os.getpid():
        os.setpgid(0, 0)  # lead a group of our own; the command inherits it
    if args.adopt is not None:
        return _adopt(args.adopt, args.parent)
    early: list[int] = []  # signals that came while the command was starting: passed on once it has
    for sig in SIGNALS:
        signal.signal(sig, lambda signum, _frame: early.append(signum))
    child = subprocess.Popen(command, stderr=subprocess.PIPE if args.stderr_log else None)
    _detach_stdio()
    for sig in SIGNALS:
        signal.signal(sig, lambda signum, _frame: _forward(child, signum))
    for signum in early:
        _forward(child, signum)
    pump = _StderrPump(child, args.stderr_log) if args.stderr_log else None
    while child.poll() is None:
        if os.getppid() != args.parent:  # the parent is gone: this guard was handed to another process
            _terminate(child)
            break
        time.sleep(POLL_S)
    status = child.wait()
    _end_group()
    if pump is not None:
        pump.finish(status)
    return 128 - status if status < 0 else status


def _detach_stdio() -> None:
    """Let go of stdin and stdout: they are the command's alone (a stdio MCP client sees EOF when the command
    ends, not when this guard does)."""
    with open(os.devnull, "rb+") as null:
        os.dup2(null.fileno(), 0)
        os.dup2(null.fileno(), 1)


def _forward(child: subprocess.Popen, signum: int) -> None:
    if child.poll() is None:
        child.send_signal(signum)


def _terminate(child: subprocess.Popen) -> None:
    child.terminate()
    try:
        child.wait(KILL_AFTER_S)
    except subprocess.TimeoutExpired:
        child.kill()


def _end_group() -> None:
    """SIGTERM whatever the command left in the group (this guard ignores it and exits next)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        os.killpg(os.getpgrp(), signal.SIGTERM)
    except ProcessLookupError:
        return


def _adopt(pid: int, parent: int) -> int:
    """Watch ``pid`` until it ends by itself (status 0), or end it and its descendants when the parent is gone or
    this guard is signalled (status 0: the process was ended as asked)."""
    _detach_stdio()
    adopted = _Proc.of(pid)
    if adopted is None:
        return 0  # ended before the guard began
    asked: list[int] = []  # a signal's number, once one came (a handler takes no lock)
    for sig in SIGNALS:
        signal.signal(sig, lambda signum, _frame: asked.append(signum))
    while adopted.alive():
        if asked or os.getppid() != parent:
            _end_tree(adopted)
            break
        time.sleep(POLL_S)
    return 0


class _Proc:
    """A process known by its pid and, where ``/proc`` tells it, its start time (so a reused pid is not it)."""

    def __init__(self, pid: int, started: str | None) -> None:
        self.pid, self.started = pid, started

    @classmethod
    def of(cls, pid: int) -> "_Proc | None":
        """The live process ``pid`` now; None if there is none."""
        stat = _stat(pid)
        if stat is not None:
            return cls(pid, stat[2]) if stat[0] != "Z" else None
        if _PROC.is_dir():
            return None  # /proc lists every live process: this one is gone
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass  # it exists, owned by another user
        return cls(pid, None)

    def alive(self) -> bool:
        """Still running (a zombie has ended), and still the process adopted."""
        now = _Proc.of(self.pid)
        return now is not None and now.started == self.started

    def signal(self, sig: signal.Signals) -> None:
        if self.alive():
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                return


_PROC = Path("/proc")


def _stat(pid: int) -> tuple[str, int, str] | None:
    """State, parent pid and start time of ``pid`` from ``/proc/PID/stat``; None without it."""
    try:
        text = (_PROC / str(pid) / "stat").read_bytes().decode(errors="replace")
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # after "pid (name) ", whatever the name holds
    return fields[0], int(fields[1]), fields[19]


def _descendants(root: _Proc) -> list[_Proc]:
    """``root``'s descendants now, found through ``/proc`` (none without it)."""
    children: dict[int, list[_Proc]] = {}
    if _PROC.is_dir():
        for entry in _PROC.iterdir():
            stat = _stat(int(entry.name)) if entry.name.isdigit() else None
            if stat is not None and stat[0] != "Z":
                children.setdefault(stat[1], []).append(_Proc(int(entry.name), stat[2]))
    found, queue = [], [root.pid]
    while queue:
        for child in children.get(queue.pop(), []):
            found.append(child)
            queue.append(child.pid)
    return found


def _end_tree(root: _Proc) -> None:
    """SIGTERM ``root`` and its descendants (taken before any ends: an ended parent's children are handed on), then
    SIGKILL whatever still runs after ``KILL_AFTER_S``."""
    tree = [root, *_descendants(root)]
    for proc in tree:
        proc.signal(signal.SIGTERM)
    deadline = time.monotonic() + KILL_AFTER_S
    while any(proc.alive() for proc in tree) and time.monotonic() < deadline:
        time.sleep(0.05)
    for proc in tree:
        proc.signal(signal.SIGKILL)


class _StderrPump:
    """Copies the command's stderr to this guard's and keeps its last lines in a file."""

    def __init__(self, child: subprocess.Popen, log: Path) -> None:
        self._child = child
        self._log = log
        self._lines: collections.deque[bytes] = collections.deque(maxlen=KEPT_LINES)
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        assert self._child.stderr is not None
        for line in iter(self._child.stderr.readline, b""):
            sys.stderr.buffer.write(line)
            sys.stderr.buffer.flush()
            with self._lock:
                self._lines.append(line)
                self._write()

    def _write(self, *tail: bytes) -> None:
        self._log.write_bytes(b"".join(self._lines) + b"".join(tail))

    def finish(self, status: int) -> None:
        self._thread.join(timeout=2.0)
        with self._lock:
            self._write(f"{EXIT_MARK} {status}\n".encode())


if __name__ == "__main__":
    sys.exit(main())
