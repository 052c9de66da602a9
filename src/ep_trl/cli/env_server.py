"""The environment server of a run: started before training, its URL exported in the variable the eval reads, and
stopped however the run ends (normal exit, an error, Ctrl-C, SIGTERM through ``ep_trl.runtime.shutdown``, and by its
watchdog, ``ep_trl/runtime/guard.py``, if the training process is killed).

``ep-trl train --env-server 'CMD --port {port}' --env-url-var NAME`` runs CMD with ``{port}`` replaced by a free
port; the training scripts start their own environments' modules (:func:`local_env_server`).
"""

import contextlib
import shlex
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from ..runtime import shutdown
from ..runtime.processes import exported, free_port, start_server

#: What ``--env-server`` must hold: where the free port goes.
PORT_FIELD = "{port}"
#: A command whose first word is one of these runs with the interpreter running ep-trl (its environment's packages).
PYTHON_NAMES = ("python", "python3")


def server_command(template: str, port: int) -> list[str]:
    """``template`` split as a shell would, with ``{port}`` replaced by ``port`` and a leading ``python`` or
    ``python3`` replaced by this interpreter (``sys.executable``). Raises ``ValueError`` naming the fix."""
    if PORT_FIELD not in template:
        raise ValueError(
            f"--env-server {template!r} has no {PORT_FIELD}: write where the server's port goes, e.g. "
            f"--env-server 'python -m ep_trl.envs.letters --port {PORT_FIELD}'"
        )
    words = shlex.split(template.replace(PORT_FIELD, str(port)))
    if words and words[0] in PYTHON_NAMES:
        words[0] = sys.executable
    return words


@contextlib.contextmanager
def command_server(
    template: str,
    *,
    url_var: str | None = None,
    env: Mapping[str, str] | None = None,
    health_path: str = "/health",
    timeout_s: float = 120.0,
    name: str | None = None,
) -> Iterator[str]:
    """Run ``template`` (:func:`server_command`) on a free port for the duration of the block and yield its URL
    (``http://127.0.0.1:PORT``), set in ``os.environ[url_var]`` while the block runs (the previous value, or none,
    put back after). The server must answer ``health_path`` within ``timeout_s``."""
    port = free_port()
    cmd = server_command(template, port)
    with _started(name or Path(cmd[0]).name, cmd, port, env, health_path, timeout_s) as url:
        with exported(url_var, url):
            yield url


@contextlib.contextmanager
def local_env_server(
    module: str, *, env: Mapping[str, str] | None = None, port: int | None = None, timeout_s: float = 120.0
) -> Iterator[str]:
    """Run ``python -m <module> --host 127.0.0.1 --port P`` for the duration of the block; yield its URL."""
    port = port or free_port()
    cmd = [sys.executable, "-m", module, "--host", "127.0.0.1", "--port", str(port)]
    with _started(module, cmd, port, env, "/health", timeout_s) as url:
        yield url


@contextlib.contextmanager
def _started(
    name: str, cmd: Sequence[str], port: int, env: Mapping[str, str] | None, health_path: str, timeout_s: float
) -> Iterator[str]:
    log_dir = Path(tempfile.mkdtemp(prefix="ep-trl-env-"))
    shutdown.handle_sigterm()
    server = start_server(name, cmd, port=port, log_dir=log_dir, env=env, health_path=health_path, timeout_s=timeout_s)
    try:
        yield server.base_url
    finally:
        server.stop()
