"""``--env-replicas N`` and a list of ``--env-base-url`` (issue 50): sessions spread over copies of one environment
server, a replica killed mid-run started again with its episodes failed as data, and the bad inputs refused before
anything starts."""

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ep_trl import EvalOverrides
from ep_trl.cli import job as job_module
from ep_trl.cli import train
from ep_trl.cli.replicas import check_same_environment
from ep_trl.errors import ConfigError
from ep_trl.evalprotocol.spec import EnvSettings
from ep_trl.openenv.pool import EnvPool
from ep_trl.runtime.processes import free_port, start_server
from tests.cli.test_train import planned_job

ROOT = Path(__file__).resolve().parents[2]
LETTERS = "evals/eval_letters.py::test_letters"
SERVER = "python -m ep_trl.envs.letters --port {port}"


def test_each_session_goes_to_the_replica_with_the_fewest_open() -> None:
    urls = ("http://127.0.0.1:1", "http://127.0.0.1:2", "http://127.0.0.1:3")
    pool = EnvPool(EnvSettings(factory=object, replica_urls=urls, url_var="URL"))
    picked = []
    for _ in range(5):
        url = pool._replica()
        pool._open[url] = pool._open.get(url, 0) + 1
        picked.append(url)
    assert picked == [urls[0], urls[1], urls[2], urls[0], urls[1]]
    pool._open[urls[2]] = 0  # its sessions closed: it has the fewest
    assert pool._replica() == urls[2]
    pool._notes.resting[urls[2]] = time.monotonic() + 60  # its connection failed: it rests while others are up
    assert pool._replica() == urls[0]
    pool._notes.resting.update({url: time.monotonic() + 60 for url in urls})  # all rest: the fewest open again
    assert pool._replica() == urls[2]


def test_replicas_are_checked_when_the_overrides_are_made() -> None:
    with pytest.raises(ConfigError, match="give one URL or more, each once"):
        EvalOverrides(env_replicas=["http://127.0.0.1:1", "http://127.0.0.1:1"])
    with pytest.raises(ConfigError, match="env_base_url and env_replicas both name the server"):
        EvalOverrides(env_base_url="http://127.0.0.1:1", env_replicas=["http://127.0.0.1:2", "http://127.0.0.1:3"])
    with pytest.raises(ConfigError, match="env_url_var=...\\): it routes env_replicas' sessions"):
        EvalOverrides(env_url_var="LETTERS_ENV_URL")
    with pytest.raises(ConfigError, match="name the environment variable the factory reads"):
        EnvSettings(factory=object, replica_urls=("http://127.0.0.1:1",)).check()


def test_replicas_without_env_server_are_refused_before_anything_starts(
    tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as ended:
        train.main([LETTERS, "--model", str(tiny_model_dir), "--env-replicas", "3"])
    assert ended.value.code == 2
    assert "--env-replicas 3 starts copies of --env-server: add --env-server" in capsys.readouterr().err


def test_servers_of_different_environments_are_not_replicas(
    letters_server: str, tmp_path: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    port = free_port()
    doors = start_server(
        "doors", [sys.executable, "-m", "ep_trl.envs.doors", "--port", str(port)], port=port, log_dir=tmp_path
    )
    try:
        with pytest.raises(ConfigError, match=re.escape(f"environment replicas ['{doors.base_url}'] do not answer")):
            check_same_environment([letters_server, doors.base_url])
        check_same_environment([letters_server, letters_server])  # the same server twice answers the same
        with pytest.raises(SystemExit) as ended:
            train.main(
                [LETTERS, "--model", str(tiny_model_dir), "--env-base-url", f"{letters_server},{doors.base_url}"]
            )
        assert ended.value.code == 2
        assert f"--env-base-url {letters_server},{doors.base_url}: environment replicas" in capsys.readouterr().err
    finally:
        doors.stop()


@pytest.mark.timeout(600)
def test_three_replicas_survive_one_killed_mid_run(tiny_model_dir: Path, tmp_path: Path) -> None:
    """One of 3 replicas is SIGKILLed (its process group) while a step's episodes play on it: it is started again
    on its port, the episodes it held fail as environment errors, and the run completes every step."""
    folder = tmp_path / "run"
    command = [sys.executable, "-m", "ep_trl.cli", "train", LETTERS, "--model", str(tiny_model_dir)]
    command += ["--env-server", SERVER, "--env-url-var", "LETTERS_ENV_URL", "--env-replicas", "3"]
    command += ["--max-steps", "6", "--num-generations", "4", "--per-device-train-batch-size", "8"]
    command += ["--max-completion-length", "64", "--output-dir", str(folder), "--report-to", "none"]
    env = {**os.environ, "LETTERS_STEP_LATENCY_S": "1.5", "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)  # type: ignore[union-attr]
    reader.start()
    try:
        deadline = time.monotonic() + 400
        while not any(line.startswith("step 1/6") for line in lines) and proc.poll() is None:
            assert time.monotonic() < deadline, "".join(lines)[-4000:]
            time.sleep(0.1)
        pids = dict(re.findall(r"^environment replica (\d): \S+ \(pid (\d+)\)", "".join(lines), flags=re.M))
        assert sorted(pids) == ["0", "1", "2"], "".join(lines)[-4000:]
        time.sleep(1.0)  # step 2's episodes are playing (each holds its session >= 3 s)
        os.killpg(int(pids["1"]), signal.SIGKILL)
        assert proc.wait(timeout=400) == 0, "".join(lines)[-6000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(timeout=10)
    output = "".join(lines)
    assert "environment replica 1: started again at" in output, output[-4000:]
    result = json.loads((folder / "result.json").read_text())
    assert result["ended"] == "finished" and result["steps"] == 6
    metrics = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert any(row.get("grad_norm", 0) > 0 for row in metrics), metrics  # training went on: a step had a gradient
    failed = sum(row.get("ep_trl/errors/environment", 0) for row in metrics)
    assert failed >= 1, metrics  # the killed replica's episodes, counted by kind


def test_the_held_out_set_spreads_over_the_replicas_as_training_does(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The held-out play is made with the replicas training's sessions spread over, not the first replica alone:
    ``run`` is stopped once the held-out play is made (the replicas stand in, as nothing connects before then)."""
    urls = ("http://127.0.0.1:1", "http://127.0.0.1:2", "http://127.0.0.1:3")
    seen: list[object] = []

    @contextlib.contextmanager
    def replicas(job: object) -> Iterator[tuple[str, ...]]:
        yield urls

    @contextlib.contextmanager
    def held_out_play(job: "job_module.TrainJob", ranks: object) -> Iterator[None]:
        seen.append(job.overrides.env_replicas)
        yield None

    monkeypatch.setattr(job_module, "_started_servers", replicas)
    monkeypatch.setattr(job_module, "_held_out_play", held_out_play)
    monkeypatch.setattr(job_module, "_held_out_accepted", lambda job, held_out, made_folder: False)
    argv = [LETTERS, "--model", str(tiny_model_dir), "--env-server", SERVER, "--env-url-var", "LETTERS_ENV_URL"]
    argv += ["--env-replicas", "3", "--held-out", "4", "--output-dir", str(tmp_path / "run"), "--report-to", "none"]
    assert job_module.run(planned_job(argv)) == 2
    assert seen == [urls]
