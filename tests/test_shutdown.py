"""No process ep_trl starts outlives its trainer, however the trainer ends (issue 21): a training process killed in
the middle of a rollout call with SIGTERM (how ``timeout``, Slurm, ``docker stop`` and Kubernetes end jobs) cleans
up and exits with status 143; with SIGKILL nothing runs in it, and the watchdog each server runs under stops it.
Before, both left the Docker-image eval's environment servers running, adopted by PID 1."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from ep_trl import shutdown

REPO = Path(__file__).resolve().parents[1]
GONE_WITHIN_S = 10.0


def descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def command(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline())
    except psutil.Error:
        return "?"


@pytest.fixture
def stdio_agent_config(tmp_path):
    config = tmp_path / "calc_stdio.json"
    config.write_text(json.dumps({"mcpServers": {"calc": {"command": sys.executable, "args": [
        str(REPO / "tests/fixtures/calc_mcp_server.py"), "stdio"]}}}))
    return config


CASES = {  # the eval, and what marks its servers in their command lines
    "docker": ("tests.evals.eval_guess_docker", "tests.fixtures.guess_env.server.app:app"),
    "stdio_mcp": ("tests.evals.eval_calculator_agent", "calc_mcp_server.py stdio"),
}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_nothing_ep_trl_started_outlives_a_killed_trainer(case, signum, tiny_model_dir, tmp_path, stdio_agent_config):
    env_path, marker = CASES[case]
    env = {**os.environ, "CALC_MCP_CONFIG": str(stdio_agent_config), "PYTHONPATH": str(REPO)}
    trainer = subprocess.Popen([sys.executable, "-m", "tests.support.killable_training", env_path,
                                str(tiny_model_dir), str(tmp_path / "out")], cwd=REPO, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output = []
    try:
        for line in trainer.stdout:
            output.append(line)
            if line.strip() == "TRAINING":
                break
        deadline = time.monotonic() + 120
        while not [p for p in descendants(trainer.pid) if marker in command(p)]:  # the call is under way
            assert trainer.poll() is None and time.monotonic() < deadline, "".join(output)[-4000:]
            time.sleep(0.2)
        started = {p: command(p) for p in descendants(trainer.pid)}
        trainer.send_signal(signum)
        status = trainer.wait(60)
    finally:
        if trainer.poll() is None:
            trainer.kill()
        output.append(trainer.stdout.read())
    assert [p for p, line in started.items() if marker in line], started
    deadline = time.monotonic() + GONE_WITHIN_S
    while [p for p in started if alive(p)] and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [f"{p.pid}: {line}" for p, line in started.items() if alive(p)]
    assert not left, left
    if signum == signal.SIGTERM:
        text = "".join(output)
        assert status == 128 + signal.SIGTERM, text[-4000:]
        assert "SIGTERM received; closing rollouts" in text


def test_sigterm_is_left_to_a_program_that_handles_it_itself():
    previous = signal.getsignal(signal.SIGTERM)
    try:
        def own(signum, frame):
            return None

        signal.signal(signal.SIGTERM, own)
        assert shutdown.handle_sigterm() is False and signal.getsignal(signal.SIGTERM) is own
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        assert shutdown.handle_sigterm() is True
        with pytest.raises(shutdown.Terminated) as raised:
            signal.getsignal(signal.SIGTERM)(signal.SIGTERM, None)
        assert raised.value.code == 143
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_registered_resources_close_newest_first_and_only_once():
    closed = []

    class Resource:
        def __init__(self, name):
            self.name = name

        def close(self):
            closed.append(self.name)

    servers, function, gone = Resource("servers"), Resource("rollout function"), Resource("closed already")
    for resource in (servers, function, gone):
        shutdown.register(resource)
    shutdown.unregister(gone)
    shutdown.close_all()
    shutdown.close_all()
    assert closed == ["rollout function", "servers"]
