"""``LocalAppProvider``: an OpenEnv runtime provider that serves an environment's app from its installed package.

Its own module because it subclasses OpenEnv's ``RuntimeProvider``, and importing ``openenv.core`` imports gradio
(seconds): ``servers`` imports this only when it launches a server, so ``import ep_trl`` and evals without a
launched environment never load OpenEnv.
"""

import os
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

# the same interface in openenv-core 0.3 and openenv 0.10
from openenv.core.containers.runtime import RuntimeProvider

from ..runtime.processes import ServerProcess, free_port, start_server


class LocalAppProvider(RuntimeProvider):  # type: ignore[misc]
    """An OpenEnv runtime provider that serves ``app`` (``"pkg.server.app:app"``) with this Python and uvicorn;
    ``start`` waits up to ``start_timeout_s`` for its ``/health``."""

    def __init__(
        self,
        app: str,
        *,
        host: str = "127.0.0.1",
        env_vars: Mapping[str, str] | None = None,
        start_timeout_s: float = 120.0,
    ) -> None:
        self.app = app
        self.host = host
        self.env_vars = dict(env_vars or {})
        self.start_timeout_s = start_timeout_s
        self._server: ServerProcess | None = None
        self._log_dir = Path(tempfile.mkdtemp(prefix="ep-trl-env-server-"))

    def start(self, port: int | None = None, env_vars: Mapping[str, str] | None = None, **_: object) -> str:
        port = port or free_port(self.host)
        env = {
            **self.env_vars,
            **(env_vars or {}),
            # the server imports the package as this process does (a file-path eval's folder is on sys.path)
            "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
        }
        cmd = [sys.executable, "-m", "uvicorn", self.app, "--host", self.host, "--port", str(port)]
        self._server = start_server(
            self.app.split(":")[0],
            cmd,
            port=port,
            log_dir=self._log_dir,
            env=env,
            host=self.host,
            timeout_s=self.start_timeout_s,
        )
        return self._server.base_url

    def wait_for_ready(self, timeout_s: float | None = None) -> None:
        """``start`` already waited for ``/health``; fail if the server died since."""
        if self._server is None or self._server.proc.poll() is not None:
            raise RuntimeError(f"the environment server for {self.app} is not running")

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    @property
    def pid(self) -> int | None:
        return self._server.pid if self._server is not None else None
