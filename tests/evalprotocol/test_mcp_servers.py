"""ep_trl.evalprotocol.mcp_servers' watch over the servers eval-protocol's MCPServerManager starts: each is handed to
one watchdog (``guard.py --adopt``) as it starts, and the watchdog leaves when the server stops the usual way.
(That the watchdog ends the server when the trainer is SIGKILLed: tests/runtime/test_shutdown.py, ``mcp_gym``.)"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from ep_trl.runtime.processes import free_port

REPO = Path(__file__).resolve().parents[2]

SERVER = """
import http.server, sys
port = int(sys.argv[sys.argv.index("--port") + 1])
http.server.HTTPServer(("127.0.0.1", port), http.server.BaseHTTPRequestHandler).serve_forever()
"""

PROGRAM = """
import sys, psutil
from eval_protocol.pytest.default_mcp_gym_rollout_processor import MCPServerManager
from ep_trl.evalprotocol.mcp_servers import watching_started_servers

def watchdogs():
    return [p for p in psutil.Process().children() if "--adopt" in p.cmdline()]

manager = MCPServerManager({script!r}, port={port})
with watching_started_servers():  # as ep_trl calls a processor, which starts its server in the call
    manager.start()
[watchdog] = watchdogs()
print("ADOPTED", watchdog.cmdline()[-1] == str(manager.process.pid), flush=True)
with watching_started_servers():  # the next call: the server is watched already
    pass
print("WATCHDOGS", len(watchdogs()), flush=True)
manager.stop()  # eval-protocol's own stop, as at the trainer's exit
print("WATCHDOG STATUS", watchdog.wait(5), flush=True)
"""


def test_a_server_an_mcp_server_manager_starts_is_watched_once_and_its_watchdog_leaves_with_it(tmp_path: Path) -> None:
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(PROGRAM.format(script=str(script), port=free_port()))],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])},
        capture_output=True,
        text=True,
        timeout=120,
    )
    said = [line for line in result.stdout.splitlines() if line.startswith(("ADOPTED", "WATCHDOG"))]
    assert said == ["ADOPTED True", "WATCHDOGS 1", "WATCHDOG STATUS 0"], (result.stdout, result.stderr[-3000:])
    assert result.returncode == 0


SLOW_SERVER = """
import http.server, sys, time
time.sleep({delay})
port = int(sys.argv[sys.argv.index("--port") + 1])
http.server.HTTPServer(("127.0.0.1", port), http.server.BaseHTTPRequestHandler).serve_forever()
"""

STARTS = """
import sys, threading, time
from eval_protocol.pytest.default_mcp_gym_rollout_processor import MCPServerManager
from ep_trl.evalprotocol import mcp_servers

mcp_servers.SERVER_START_S = {bound}
with mcp_servers.watching_started_servers():  # as ep_trl calls a processor: the manager's wait is bounded from here
    pass
manager = MCPServerManager({script!r}, port={port})
said = []

def start():
    try:
        manager.start()
        said.append("STARTED")
    except RuntimeError as exc:
        said.append("REFUSED " + str(exc).split(".")[0])

started = time.monotonic()
thread = threading.Thread(target=start, daemon=True)
thread.start()
thread.join(30)
print("SAID", said[0] if said else "NOTHING: still waiting", flush=True)
print("SERVER ENDED", manager.process.poll() is not None, flush=True)
print("WITHIN", time.monotonic() - started < 25, flush=True)
manager.stop()
"""


def _start(tmp_path: Path, script_text: str, bound: float) -> "tuple[list[str], subprocess.CompletedProcess[str]]":
    script = tmp_path / "server.py"
    script.write_text(script_text)
    program = STARTS.format(script=str(script), port=free_port(), bound=bound)
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(program)],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])},
        capture_output=True,
        text=True,
        timeout=120,
    )
    return [line for line in result.stdout.splitlines() if line.startswith(("SAID", "SERVER ENDED", "WITHIN"))], result


def test_a_server_that_never_takes_a_connection_fails_the_start_instead_of_hanging_it(tmp_path: Path) -> None:
    """eval-protocol's manager waits 15 s for its server (ep_trl's bound is never less), then reads the running
    server's output with communicate(), which waits for the server to end: forever. Under ep_trl the server is killed
    at the bound, and start() raises."""
    said, result = _start(tmp_path, "import time\ntime.sleep(600)\n", bound=2)
    assert said == ["SAID REFUSED Server failed to start or become ready", "SERVER ENDED True", "WITHIN True"], (
        result.stdout[-2000:],
        result.stderr[-2000:],
    )


def test_a_server_slower_than_the_managers_own_wait_starts_under_the_bound(tmp_path: Path) -> None:
    """The manager asks for 15 s; ep_trl's bound (here 20 s) lets a server that takes longer (here 16 s) start."""
    said, result = _start(tmp_path, SLOW_SERVER.format(delay=16), bound=20)
    assert said == ["SAID STARTED", "SERVER ENDED False", "WITHIN True"], (result.stdout[-2000:], result.stderr[-2000:])
