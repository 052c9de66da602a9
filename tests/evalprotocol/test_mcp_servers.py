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


def test_a_server_an_mcp_server_manager_starts_is_watched_once_and_its_watchdog_leaves_with_it(tmp_path):
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
