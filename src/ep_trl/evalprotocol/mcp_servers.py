"""The stdio MCP servers an agent eval's processor starts, run under ep_trl's watchdog.

An ``AgentRolloutProcessor`` eval names its MCP servers in a config file (``mcp_config_path``); the processor starts
each stdio server itself, once per row, with MCP's stdio client, whose stderr goes to the console only. ep_trl hands
each row a copy of that config in which every stdio server's command runs under ``ep_trl/runtime/guard.py``, so the server

* ends with the trainer, however the trainer ends (a SIGKILL included), and
* leaves its last stderr lines and exit status behind: an episode that fails because its server died says why, in
  the server's own words, instead of MCP's bare ``Connection closed``.

URL servers are left as they are; a config without stdio servers is handed over unchanged.
"""

import json
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ..runtime.guard import EXIT_MARK
from ..runtime.processes import guarded
from ..trajectory.types import JSONObject

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
            status = next((ln[len(EXIT_MARK):].strip() for ln in reversed(lines) if ln.startswith(EXIT_MARK)), None)
            said = [ln for ln in lines if not ln.startswith(EXIT_MARK)][-QUOTED_LINES:]
            if not said and status in (None, "0", "-15"):  # nothing to say, or ended at the processor's cleanup
                continue
            how = ("still running" if status is None else f"ended by signal {status[1:]}" if status.startswith("-")
                   else f"exited with status {status}")
            text = " | ".join(said)
            if len(text) > QUOTED_CHARS:
                text = "..." + text[-QUOTED_CHARS:]
            parts.append(f"stdio MCP server {name!r} (`{self.commands[name]}`) {how}; its stderr ends: {text}"
                         if said else f"stdio MCP server {name!r} (`{self.commands[name]}`) {how}")
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
