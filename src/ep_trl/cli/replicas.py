"""Environment replicas (docs/scaling.md): ``--env-replicas N`` copies of ``--env-server``, each on its own port,
watched and restarted on the same port when one dies; and the check, at start, that replicas (or the servers a list
of ``--env-base-url`` names) answer the same environment.

Sessions are spread over the replicas by the bridge (``EvalOverrides.env_replicas``: each session to the replica
with the fewest sessions open). A replica that dies costs the episodes playing on it (environment errors, counted);
the watcher starts it again, and training goes on."""

import json
import logging
import tempfile
import threading
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ..errors import ConfigError
from ..runtime import shutdown
from ..runtime.processes import ServerProcess, free_port, start_server
from .env_server import server_command

logger = logging.getLogger(__name__)

#: How often the watcher looks for a replica that died.
WATCH_S = 0.5
#: What a stock OpenEnv server says of itself: which environment it is.
IDENTITY_PATHS = ("/metadata", "/schema")


class Replicas:
    """``count`` servers of ``template`` (``--env-server``'s command), started now, each healthy at ``health_path``
    within ``timeout_s``; ``close()`` stops them and their watcher."""

    def __init__(
        self,
        template: str,
        count: int,
        *,
        env: Mapping[str, str] | None = None,
        health_path: str = "/health",
        timeout_s: float = 120.0,
    ) -> None:
        self._template, self._env, self._health, self._timeout_s = template, env, health_path, timeout_s
        self._log_dir = Path(tempfile.mkdtemp(prefix="ep-trl-env-replicas-"))
        self._servers: list[ServerProcess] = []
        self._closing = threading.Event()
        #: How many times a replica that died was started again.
        self.restarts = 0
        shutdown.handle_sigterm()
        try:
            with ThreadPoolExecutor(max_workers=count) as pool:  # started together: each waits for its health
                starting = [pool.submit(self._start, free_port()) for _ in range(count)]
                for future in starting:
                    try:
                        self._servers.append(future.result())
                    except BaseException:
                        for other in starting:  # stop those that did start before the error goes on
                            if other is not future and other.exception() is None:
                                other.result().stop()
                        raise
            check_same_environment(self.urls)
        except BaseException:
            self.close()
            raise
        self._watcher = threading.Thread(target=self._watch, name="ep-trl-env-replicas", daemon=True)
        self._watcher.start()

    @property
    def urls(self) -> tuple[str, ...]:
        return tuple(server.base_url for server in self._servers)

    @property
    def pids(self) -> tuple[int, ...]:
        """Each replica's process (the leader of its process group)."""
        return tuple(server.pid for server in self._servers)

    def close(self) -> None:
        self._closing.set()
        for server in self._servers:
            server.stop()

    def _start(self, port: int) -> ServerProcess:
        command = server_command(self._template, port)
        return start_server(
            Path(command[0]).name,
            command,
            port=port,
            log_dir=self._log_dir,
            env=self._env,
            health_path=self._health,
            timeout_s=self._timeout_s,
        )

    def _watch(self) -> None:
        while not self._closing.wait(WATCH_S):
            for index, server in enumerate(self._servers):
                if server.proc.poll() is None or self._closing.is_set():
                    continue
                logger.warning(
                    "environment replica %d at %s (pid %d) ended with status %s; its episodes in flight fail as "
                    "environment errors, and it is started again on the same port",
                    index,
                    server.base_url,
                    server.pid,
                    server.proc.returncode,
                )
                try:
                    self._servers[index] = self._start(server.port)
                except (RuntimeError, OSError, TimeoutError) as error:  # start_server's failures: tried again
                    logger.error("environment replica %d could not be started again: %s", index, error)
                    continue
                self.restarts += 1
                print(f"environment replica {index}: started again at {server.base_url}", flush=True)


def identity(url: str, timeout_s: float = 10.0) -> str:
    """What the server at ``url`` says it is (a stock OpenEnv server's ``/metadata`` and ``/schema``), as one
    string; a path it does not answer is noted as such."""
    parts = []
    for path in IDENTITY_PATHS:
        try:
            with urllib.request.urlopen(url.rstrip("/") + path, timeout=timeout_s) as reply:  # noqa: S310 - its URL
                parts.append(json.dumps(json.loads(reply.read()), sort_keys=True))
        except (urllib.error.URLError, OSError, ValueError) as error:
            parts.append(f"{path}: no answer ({type(error).__name__})")
    return "\n".join(parts)


def check_same_environment(urls: Sequence[str]) -> None:
    """``ConfigError`` naming the replicas whose environment differs from the first's (its name, version and
    action and observation schemas)."""
    if len(urls) < 2:
        return
    first = identity(urls[0])
    differ = [url for url in urls[1:] if identity(url) != first]
    if differ:
        raise ConfigError(
            f"environment replicas {list(differ)} do not answer the same environment as {urls[0]} (their /metadata "
            "or /schema differ): replicas must be copies of one environment server. Start the same server for each, "
            "or train on one of them."
        )
