"""Start and stop local server subprocesses: environment servers, vLLM, BrowserGym.

Used by the training scripts (which start their environment server and stop it on exit, Ctrl-C included) and by
the tests. Each server runs in its own session (process group) so helpers it spawns
(e.g. vLLM engine workers) are killed with it, and its stdout/stderr go to a
log file (not a pipe, which a chatty server could fill and block on) whose
tail is put into error messages. Each runs under ``ep_trl/runtime/guard.py``, a watchdog that stops it when the process
that started it is gone, killed with SIGKILL included (``guarded``); a process a library started is handed to one
(``adopting``).
"""

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

logger = logging.getLogger(__name__)

DEFAULT_START_TIMEOUT_S = 60.0


class ServerStartError(RuntimeError):
    """A server process died or did not answer its health URL in time."""


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port that is free right now (the OS picks it).

    There is a small race between closing this probe socket and the server
    binding the port; acceptable on one machine.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_holder(port: int) -> str | None:
    """``pid N (command line)`` of the process listening on ``port``, if this user can see it."""
    import psutil

    try:
        connections = psutil.net_connections(kind="inet")
    except psutil.AccessDenied:
        return None
    for connection in connections:
        if (
            connection.status == psutil.CONN_LISTEN
            and connection.laddr
            and connection.laddr.port == port
            and connection.pid is not None
        ):
            try:
                command = " ".join(psutil.Process(connection.pid).cmdline())
            except psutil.Error:
                command = "?"
            return f"pid {connection.pid} ({command[:200]})"
    return None


def _tail(path: Path, max_chars: int) -> str:
    """Last ``max_chars`` characters of a log file ('' if it cannot be read)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        return f"<could not read {path}: {exc}>"
    return data[-max_chars:].decode("utf-8", errors="replace")


@dataclass
class ServerProcess:
    """A running server subprocess and where to reach it."""

    name: str
    proc: subprocess.Popen
    host: str
    port: int
    log_path: Path

    @property
    def base_url(self) -> str:
        """``http://host:port`` of the server."""
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        """Process id (also the process-group id, as it leads its own session)."""
        return self.proc.pid

    def output_tail(self, max_chars: int = 4000) -> str:
        """The end of the server's combined stdout/stderr."""
        return _tail(self.log_path, max_chars)

    def output(self) -> str:
        """The server's whole combined stdout/stderr so far."""
        return self.log_path.read_bytes().decode("utf-8", errors="replace")

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the server and everything in its process group."""
        stop_process(self.proc, timeout_s=timeout_s)


def _http_ok(url: str, timeout_s: float) -> bool:
    """True when ``url`` answers with a 2xx status."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 - a local URL
            return 200 <= resp.status < 300
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False


def wait_for_http(server: ServerProcess, health_url: str, timeout_s: float = DEFAULT_START_TIMEOUT_S) -> None:
    """Poll ``health_url`` until it answers 2xx; raise if the server dies or time runs out.

    The error names the server, its exit code if it exited, and the tail of its
    output, because a bare timeout is useless when debugging a CI failure.
    """
    deadline = time.monotonic() + timeout_s
    delay = 0.05
    while True:
        code = server.proc.poll()
        if code is not None:
            raise ServerStartError(
                f"{server.name} exited with code {code} before {health_url} answered.\n"
                f"--- output tail ({server.log_path}) ---\n{server.output_tail()}"
            )
        if _http_ok(health_url, timeout_s=2.0):
            return
        if time.monotonic() > deadline:
            raise ServerStartError(
                f"{server.name} (pid {server.pid}) did not answer {health_url} within {timeout_s:g} s.\n"
                f"--- output tail ({server.log_path}) ---\n{server.output_tail()}"
            )
        time.sleep(delay)
        delay = min(delay * 1.5, 0.5)


#: The watchdog every started process runs under (``ep_trl/runtime/guard.py``, run by path: no ep_trl import).
GUARD = Path(__file__).with_name("guard.py")


def guarded(cmd: Sequence[str], stderr_log: Path | None = None) -> list[str]:
    """``cmd`` run under :mod:`ep_trl.runtime.guard`: it ends when this process ends, however this process ends (SIGKILL
    included), and with ``stderr_log`` its last stderr lines are kept there."""
    log = ["--stderr-log", str(stderr_log)] if stderr_log is not None else []
    return [sys.executable, str(GUARD), "--parent", str(os.getpid()), *log, "--", *cmd]


def adopting(pid: int) -> list[str]:
    """The watchdog for ``pid``, a process this process started by other means (a library's ``subprocess.Popen``):
    :mod:`ep_trl.runtime.guard` with ``--adopt`` ends it and its descendants when this process ends, however this
    process ends (SIGKILL included)."""
    return [sys.executable, str(GUARD), "--parent", str(os.getpid()), "--adopt", str(pid)]


def start_server(
    name: str,
    cmd: Sequence[str],
    *,
    port: int,
    log_dir: Path,
    health_path: str = "/health",
    host: str = "127.0.0.1",
    env: Optional[Mapping[str, str]] = None,
    unset_env: Sequence[str] = (),
    cwd: Optional[Path] = None,
    timeout_s: float = DEFAULT_START_TIMEOUT_S,
) -> ServerProcess:
    """Start ``cmd`` (which must bind ``host:port``) and wait until it is healthy.

    The child gets the current environment minus ``unset_env`` plus ``env``
    (so a developer's shell settings cannot silently change a server's
    behaviour under test). It runs under :func:`guarded`'s watchdog, so it stops when this process ends, even by
    SIGKILL. On failure the process is stopped before the error propagates, so a failed fixture leaves nothing
    running.
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}-{port}.log"
    full_env = {k: v for k, v in os.environ.items() if k not in set(unset_env)}
    if env:
        full_env.update(env)
    logger.info("Starting %s on %s:%d: %s", name, host, port, " ".join(cmd))
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            guarded(cmd),
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=full_env,
            cwd=str(cwd) if cwd else None,
            start_new_session=True,
        )
    server = ServerProcess(name=name, proc=proc, host=host, port=port, log_path=log_path)
    started = time.monotonic()
    try:
        wait_for_http(server, f"{server.base_url}{health_path}", timeout_s=timeout_s)
    except BaseException:
        server.stop()
        raise
    logger.info("%s ready at %s after %.1f s (pid %d)", name, server.base_url, time.monotonic() - started, proc.pid)
    return server


def _kill_group(pgid: int, sig: signal.Signals) -> None:
    """Signal a process group, tolerating that it is already gone."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        logger.debug("Process group %d already gone (%s)", pgid, sig.name)


def stop_process(proc: subprocess.Popen, timeout_s: float = 10.0) -> None:
    """Terminate ``proc``, escalate to SIGKILL, then kill what remains of its group.

    ``proc`` must have been started with ``start_new_session=True`` so that its
    pid is its process-group id and no unrelated process shares the group.
    """
    pgid = proc.pid
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            logger.warning("pid %d ignored SIGTERM for %.0f s; killing its group", proc.pid, timeout_s)
            _kill_group(pgid, signal.SIGKILL)
            proc.wait(timeout=timeout_s)
    # Children (workers, browsers) may outlive the leader; they still carry its pgid.
    _kill_group(pgid, signal.SIGKILL)


@contextlib.contextmanager
def exported(var: str | None, value: str) -> Iterator[None]:
    """``os.environ[var] = value`` for the block (nothing when ``var`` is None), the previous value, or none, put back
    after: the variable a program reads its server's URL from."""
    if var is None:
        yield
        return
    previous = os.environ.get(var)
    os.environ[var] = value
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = previous
