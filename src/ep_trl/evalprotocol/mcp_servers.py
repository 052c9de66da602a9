"""The MCP servers an eval's processor starts, each under ep_trl's watchdog: an agent eval's stdio servers, and the
servers eval-protocol's ``MCPServerManager`` starts (``MCPGymRolloutProcessor``'s MCP-gym server).

An ``AgentRolloutProcessor`` eval names its MCP servers in a config file (``mcp_config_path``); the processor starts
each stdio server itself, once per row, with MCP's stdio client, whose stderr goes to the console only. ep_trl hands
each row a copy of that config in which every stdio server's command runs under ``ep_trl/runtime/guard.py``, so the
server

* ends with the trainer, however the trainer ends (a SIGKILL included), and
* leaves its last stderr lines and exit status behind: an episode that fails because its server died says why, in
  the server's own words, instead of MCP's bare ``Connection closed``.

URL servers are left as they are; a config without stdio servers is handed over unchanged.

An ``MCPGymRolloutProcessor`` starts its server itself, inside its call (``MCPServerManager.start``: a plain
``subprocess.Popen`` of ``python SERVER --port N``, then a wait of up to 15 s for the port), and stops it at the
interpreter's exit only: a trainer killed with SIGKILL left it running, holding its port, and the next run's every
episode failed ("Port 9700 is already in use"). While ep_trl calls a processor, ``watching_started_servers`` looks for
every server an ``MCPServerManager`` of this process has started every ``WATCH_S`` and hands each new one to a
watchdog (``guard.py --adopt PID``), which ends it and its descendants when the trainer ends, however it ends. What
is left unwatched is the ``WATCH_S`` after the server's start.

The manager's wait for its server is bounded too (``bound_server_starts``). Its own wait is 15 s; when the server
has not taken a connection by then, eval-protocol 0.3.33 reads the running server's output with ``communicate()``,
which returns only when the server ends: the processor's call, and with it the trainer, waited forever. That
happened here on a loaded machine, where the FrozenLake server took longer than 15 s to start. While ep_trl runs a
processor, the manager waits up to ``SERVER_START_S`` instead, and a server that has still not taken a connection is
killed, so the manager's error (``Server failed to start``) fails the episode as an environment error.
"""

import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..runtime.guard import EXIT_MARK
from ..runtime.processes import adopting, guarded
from ..trajectory.types import JSONObject
from ._private import SERVER_MANAGERS_ATTRIBUTE, SERVER_READY_METHOD, private_attr, private_name

#: How much of a server's stderr an episode error quotes.
QUOTED_LINES = 5
QUOTED_CHARS = 600
#: How long a failed episode waits for its ending servers' exit status.
SETTLE_S = 2.0


@dataclass(frozen=True)
class RolloutServers:
    """One rollout's copy of the config and where its stdio servers' stderr is kept."""

    config_path: str
    logs: dict[str, Path]
    commands: dict[str, str]

    def stderr_summary(self) -> str | None:
        """What the rollout's stdio servers said on stderr and how they exited, on one bounded line; None if
        nothing. The processor sees a server's end before its watchdog has written the end of the log, so this
        waits up to ``SETTLE_S`` for the exit status of servers that are ending."""
        deadline = time.monotonic() + SETTLE_S
        while time.monotonic() < deadline and not all(_ended(log) for log in self.logs.values() if log.exists()):
            time.sleep(0.05)
        parts = []
        for name, log in self.logs.items():
            if not log.exists():
                continue
            lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
            status = next((ln[len(EXIT_MARK) :].strip() for ln in reversed(lines) if ln.startswith(EXIT_MARK)), None)
            said = [ln for ln in lines if not ln.startswith(EXIT_MARK)][-QUOTED_LINES:]
            if not said and status in (None, "0", "-15"):  # nothing to say, or ended at the processor's cleanup
                continue
            how = (
                "still running"
                if status is None
                else f"ended by signal {status[1:]}"
                if status.startswith("-")
                else f"exited with status {status}"
            )
            text = " | ".join(said)
            if len(text) > QUOTED_CHARS:
                text = "..." + text[-QUOTED_CHARS:]
            parts.append(
                f"stdio MCP server {name!r} (`{self.commands[name]}`) {how}; its stderr ends: {text}"
                if said
                else f"stdio MCP server {name!r} (`{self.commands[name]}`) {how}"
            )
        return "; ".join(parts) or None


def _ended(log: Path) -> bool:
    return EXIT_MARK.encode() in log.read_bytes()[-200:]


class StdioServers:
    """Copies of an eval's MCP config with its stdio servers guarded, one per rollout."""

    def __init__(self, config_path: str | None) -> None:
        self._config_path = config_path
        self._config: JSONObject | None = None
        self._directory: Path | None = None
        if config_path and Path(config_path).is_file():  # eval-protocol ignores a config path that does not exist
            config = json.loads(Path(config_path).read_text())
            if any("command" in server for server in (config.get("mcpServers") or {}).values()):
                self._config = config

    def for_rollout(self, rollout_id: str) -> RolloutServers:
        if self._config is None:
            return RolloutServers(self._config_path or "", {}, {})
        if self._directory is None:
            self._directory = Path(tempfile.mkdtemp(prefix="ep-trl-mcp-"))
        servers: dict[str, JSONObject] = {}
        logs: dict[str, Path] = {}
        commands: dict[str, str] = {}
        for name, server in self._config["mcpServers"].items():
            if "command" not in server:
                servers[name] = server
                continue
            command = [server["command"], *(server.get("args") or [])]
            logs[name] = self._directory / f"{rollout_id}.{len(logs)}.stderr"
            commands[name] = " ".join(command)
            wrapped = guarded(command, logs[name])
            servers[name] = {**server, "command": wrapped[0], "args": wrapped[1:]}
        path = self._directory / f"{rollout_id}.json"
        path.write_text(json.dumps({**self._config, "mcpServers": servers}))
        return RolloutServers(str(path), logs, commands)

    def discard(self, servers: RolloutServers) -> None:
        """Delete a rollout's copy and logs (the servers have ended with the rollout)."""
        if not servers.logs:
            return
        Path(servers.config_path).unlink(missing_ok=True)
        for log in servers.logs.values():
            log.unlink(missing_ok=True)

    def close(self) -> None:
        if self._directory is not None:
            shutil.rmtree(self._directory, ignore_errors=True)
            self._directory = None


#: The module of eval-protocol's ``MCPServerManager`` (no manager exists before it is imported).
MANAGER_MODULE = "eval_protocol.pytest.default_mcp_gym_rollout_processor"
#: How often a processor's call is looked at for servers it started.
WATCH_S = 0.05


class _AdoptedServers:
    """The watchdogs of this process's ``MCPServerManager`` servers, one per server for as long as it runs."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owner = os.getpid()
        self._watchdogs: dict[int, subprocess.Popen[bytes]] = {}

    def adopt_started(self) -> tuple[int, ...]:
        """Hand every running server that an ``MCPServerManager`` of this process started, and no watchdog watches
        yet, to one; the pids handed over."""
        if MANAGER_MODULE not in sys.modules:
            return ()
        managers = private_attr(private_name(MANAGER_MODULE, "MCPServerManager"), SERVER_MANAGERS_ATTRIBUTE)
        adopted = []
        with self._lock:
            if self._owner != os.getpid():  # a fork: the parent's watchdogs and servers are the parent's
                self._owner, self._watchdogs = os.getpid(), {}
            for pid, watchdog in list(self._watchdogs.items()):
                if watchdog.poll() is not None:  # its server ended, and so did it
                    del self._watchdogs[pid]
            for manager in list(managers):
                process = manager.process
                if process is None or process.pid in self._watchdogs or not _runs_as_child(process.pid):
                    continue
                self._watchdogs[process.pid] = subprocess.Popen(
                    adopting(process.pid), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL
                )
                adopted.append(process.pid)
        return tuple(adopted)


def _runs_as_child(pid: int) -> bool:
    """``pid`` is a live child of this process (a fork's copy of its parent's managers names the parent's)."""
    import psutil

    try:
        process = psutil.Process(pid)
        return process.ppid() == os.getpid() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


_ADOPTED = _AdoptedServers()


#: How long a server that an ``MCPServerManager`` starts may take to take connections (the manager's own wait: 15 s).
SERVER_START_S = 120.0
#: Marks the manager's wait once ``bound_server_starts`` has bounded it.
_BOUNDED = "__ep_trl_bounded__"


def bound_server_starts() -> None:
    """Make ``MCPServerManager`` wait up to ``SERVER_START_S`` for its server, and kill a server that never takes a
    connection, so that the manager raises instead of waiting for it forever (the module docstring says why); once
    per process, from the first processor call that could start one."""
    if MANAGER_MODULE not in sys.modules:
        return
    manager_class = private_name(MANAGER_MODULE, "MCPServerManager")
    wait = private_attr(manager_class, SERVER_READY_METHOD)
    if getattr(wait, _BOUNDED, False):
        return

    @functools.wraps(wait)
    def bounded_wait(manager: object, timeout: float = 15) -> bool:
        ready = bool(wait(manager, timeout=max(timeout, SERVER_START_S)))
        process = getattr(manager, "process", None)
        if not ready and isinstance(process, subprocess.Popen) and process.poll() is None:
            process.kill()  # the manager then reads its output with communicate(), which returns once it has ended
            process.wait()
        return ready

    setattr(bounded_wait, _BOUNDED, True)
    setattr(manager_class, SERVER_READY_METHOD, bounded_wait)


@contextmanager
def watching_started_servers() -> Iterator[None]:
    """Around a processor's call: every ``WATCH_S`` while it runs, and once more when it returns or raises, each
    server an ``MCPServerManager`` started is handed to a watchdog (``guard.py --adopt``); the manager's wait for its
    server is bounded (``bound_server_starts``)."""
    bound_server_starts()
    done = threading.Event()

    def watch() -> None:
        while not done.wait(WATCH_S):
            _ADOPTED.adopt_started()

    watcher = threading.Thread(target=watch, name="ep-trl MCP server watch", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()
        _ADOPTED.adopt_started()
