"""ep_trl.runtime.processes: start, health-wait, clear failures, and group-wide stop."""

import sys
import time
from pathlib import Path

import pytest

from ep_trl.runtime.processes import ServerStartError, free_port, start_server


def _alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (an orphan may wait unreaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_start_wait_and_stop_kills_the_whole_group(tmp_path: Path) -> None:
    port = free_port()
    child_pid_file = tmp_path / "child.pid"
    script = (
        f"sleep 300 & echo $! > {child_pid_file}; "
        f"exec {sys.executable} -m http.server {port} --bind 127.0.0.1 --directory {tmp_path}"
    )
    server = start_server("http-server", ["sh", "-c", script], port=port, log_dir=tmp_path, health_path="/")
    try:
        assert server.proc.poll() is None
        assert server.base_url == f"http://127.0.0.1:{port}"
        child_pid = int(child_pid_file.read_text())
        assert _alive(child_pid)
    finally:
        server.stop(timeout_s=5)
    assert server.proc.returncode is not None
    deadline = time.monotonic() + 5
    while _alive(child_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child_pid), "a child in the server's process group survived stop()"


def test_server_that_dies_reports_exit_code_and_output(tmp_path: Path) -> None:
    cmd = [sys.executable, "-c", "import sys; print('boom: missing model weights', file=sys.stderr); sys.exit(7)"]
    with pytest.raises(ServerStartError) as info:
        start_server("dying", cmd, port=free_port(), log_dir=tmp_path, timeout_s=20)
    message = str(info.value)
    assert "dying exited with code 7" in message
    assert "boom: missing model weights" in message


def test_server_that_never_answers_times_out_and_is_stopped(tmp_path: Path) -> None:
    cmd = [
        sys.executable,
        "-c",
        "import sys, time; print('still loading', file=sys.stderr, flush=True); time.sleep(60)",
    ]
    started = time.monotonic()
    with pytest.raises(ServerStartError) as info:
        start_server("silent", cmd, port=free_port(), log_dir=tmp_path, timeout_s=1.5)
    assert time.monotonic() - started < 15
    message = str(info.value)
    assert "did not answer" in message and "within 1.5 s" in message
    assert "still loading" in message
    pid = int(message.split("(pid ")[1].split(")")[0])
    assert not _alive(pid)
