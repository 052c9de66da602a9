"""The project's BrowserGym server (``python -m ep_trl.envs.browsergym``, headless Chromium) for the test modules that
play real MiniWoB episodes: started, exported as ``BROWSERGYM_ENV_URL`` the way the training script exports it, and
stopped by PID."""

import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from ep_trl.runtime.processes import ServerProcess, free_port, start_server

#: The variable the BrowserGym eval reads its server's URL from.
BROWSERGYM_ENV_URL_VAR = "BROWSERGYM_ENV_URL"
#: A server for a module's tests: two sessions at once (the eval's ``max_concurrent_rollouts``).
DEFAULT_SERVER_ENV = {"BROWSERGYM_MAX_SESSIONS": "2"}
#: A Chromium start on a busy 2-core machine can take a minute.
START_TIMEOUT_S = 120.0


@contextmanager
def browsergym_server(log_dir: Path, env: Mapping[str, str] | None = None) -> Iterator[ServerProcess]:
    """A BrowserGym server with :data:`DEFAULT_SERVER_ENV` and ``env`` (``BROWSERGYM_*`` settings), its URL in
    ``BROWSERGYM_ENV_URL`` while it runs (the previous value, or none, restored after); stopped on exit."""
    port = free_port()
    server = start_server(
        "browsergym",
        [sys.executable, "-m", "ep_trl.envs.browsergym", "--host", "127.0.0.1", "--port", str(port)],
        port=port,
        log_dir=log_dir,
        env={**DEFAULT_SERVER_ENV, **(env or {})},
        timeout_s=START_TIMEOUT_S,
    )
    previous = os.environ.get(BROWSERGYM_ENV_URL_VAR)
    os.environ[BROWSERGYM_ENV_URL_VAR] = server.base_url
    try:
        yield server
    finally:
        if previous is None:
            os.environ.pop(BROWSERGYM_ENV_URL_VAR, None)
        else:
            os.environ[BROWSERGYM_ENV_URL_VAR] = previous
        server.stop()
