"""Start a letters env server and read its episode record (used by conftest and tests)."""

import json
import sys
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional

from ep_trl.runtime.processes import ServerProcess, free_port, start_server

#: Game settings the server reads from its own environment (names as in
#: ep_trl.envs.letters.environment; spelled out so importing this helper does
#: not import openenv-core, which takes seconds because it pulls in gradio).
SERVER_SETTING_VARS = (
    "LETTERS_TASK",
    "LETTERS_MAX_STEPS",
    "LETTERS_STEP_LATENCY_S",
    "LETTERS_TAIL_EVERY",
    "LETTERS_TAIL_LATENCY_S",
    "LETTERS_MAX_SESSIONS",
)

#: Env var through which eval modules find the letters server (read at call time).
LETTERS_ENV_URL_VAR = "LETTERS_ENV_URL"


def start_letters_server(log_dir: Path, env: Optional[Mapping[str, str]] = None) -> ServerProcess:
    """Run ``python -m ep_trl.envs.letters`` on a free port and wait for ``/health``.

    ``env`` sets server-side variables such as ``LETTERS_STEP_LATENCY_S``; any
    ``LETTERS_*`` game settings inherited from the caller's shell are dropped
    first so the server's defaults are known.
    """
    port = free_port()
    cmd = [sys.executable, "-m", "ep_trl.envs.letters", "--host", "127.0.0.1", "--port", str(port)]
    return start_server("letters-env", cmd, port=port, log_dir=log_dir, env=env, unset_env=SERVER_SETTING_VARS)


class LettersEpisodes:
    """Callable view of a letters server's ``/episodes`` record."""

    def __init__(self, base_url: str, timeout_s: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s

    def __call__(self) -> list[dict[str, Any]]:
        """``GET /episodes``: every episode, oldest first."""
        with urllib.request.urlopen(f"{self.base_url}/episodes", timeout=self.timeout_s) as resp:  # noqa: S310
            return json.loads(resp.read())

    def by_id(self) -> dict[str, dict[str, Any]]:
        """The same record keyed by episode id."""
        return {ep["episode_id"]: ep for ep in self()}

    def clear(self) -> int:
        """``POST /episodes/clear``; returns how many episodes were dropped."""
        req = urllib.request.Request(f"{self.base_url}/episodes/clear", data=b"", method="POST")
        with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:  # noqa: S310
            return int(json.loads(resp.read())["cleared"])
