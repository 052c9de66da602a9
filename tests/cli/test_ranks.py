"""``ep-trl train`` as several processes (``torchrun``, what ``accelerate launch`` runs; issue 50): the main process
alone starts the servers, writes the run folder and prints; every process trains on its own whole prompt groups; each
episode is logged once; and the text the environment received is the text the rows say the model sampled."""

import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from eval_protocol.dataset_logger.sqlite_dataset_logger_adapter import SqliteDatasetLoggerAdapter

from ep_trl.cli import train
from ep_trl.cli.ranks import Ranks, from_main
from ep_trl.runtime.processes import free_port

if TYPE_CHECKING:
    from tests.support.letters import LettersEpisodes


ROOT = Path(__file__).resolve().parents[2]
LETTERS = "evals/eval_letters.py::test_letters"
STEPS, PER_PROCESS, GROUP = 2, 4, 4


def torchrun(args: list[str], home: Path, *, env: dict[str, str] | None = None, timeout: int = 420) -> str:
    """``torchrun --nproc_per_node 2 -m ep_trl.cli train ARGS`` to its end, with its own ``HOME`` (the ``ep logs``
    store); its output."""
    home.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    command += ["--master_port", str(free_port()), "-m", "ep_trl.cli", "train", *args]
    done = subprocess.run(
        command,
        cwd=ROOT,
        env={
            **os.environ,
            **(env or {}),
            "HOME": str(home),
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
        },
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-8000:]
    return output


def small_run(model: Path, folder: Path) -> list[str]:
    return [
        LETTERS,
        "--model",
        str(model),
        "--max-steps",
        str(STEPS),
        "--num-generations",
        str(GROUP),
        "--per-device-train-batch-size",
        str(PER_PROCESS),
        "--max-completion-length",
        "64",
        "--output-dir",
        str(folder),
        "--report-to",
        "none",
    ]


def stored_rows(home: Path) -> list:
    store = SqliteDatasetLoggerAdapter(db_path=str(home / ".eval_protocol" / "logs.db"))
    return [row for row in store.read() if row.rollout_status.code is not None]


def final_rows(home: Path) -> list:
    """Each episode's last logged version (its row is updated as it plays)."""
    latest = {}
    for row in stored_rows(home):
        latest[row.execution_metadata.rollout_id] = row
    return list(latest.values())


def assert_one_run_folder(folder: Path, output: str, episodes: int) -> None:
    result = json.loads((folder / "result.json").read_text())
    assert result["steps"] == STEPS and result["ended"] == "finished"
    metrics = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) >= STEPS
    assert any(row.get("grad_norm", 0) > 0 for row in metrics), metrics  # it trained: a step had a gradient
    assert (folder / "checkpoint" / "config.json").is_file()
    # the main process alone prints the progress and the summary; the episodes are every process's
    assert len(re.findall(r"^step 1/2 ", output, flags=re.M)) == 1, output[-4000:]
    assert len(re.findall(r"^done: ", output, flags=re.M)) == 1
    assert f"done: {STEPS} steps, {episodes} episodes" in output
    assert "2 processes, each training on its own share of the prompts" in output


def test_one_process_is_the_main_one_and_makes_the_values() -> None:
    assert Ranks.from_env() == Ranks(0, 1) and Ranks(0, 1).main and not Ranks(0, 1).several
    assert not Ranks(1, 2).main and Ranks(1, 2).several
    assert from_main(Ranks(0, 1), lambda: "made") == "made"


def test_a_process_share_that_splits_a_prompt_group_is_refused(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(SystemExit) as ended:
        train.main([LETTERS, "--model", str(tiny_model_dir), "--num-generations", "8", "--per-device-train-batch-size",
                    "4"])  # fmt: skip
    assert ended.value.code == 2
    err = capsys.readouterr().err
    assert "2 processes: each plays per_device_train_batch_size x steps_per_generation = 4 x 1 = 4 episodes" in err
    assert "not a multiple of --num-generations 8" in err and "--per-device-train-batch-size 8" in err


def test_servers_the_run_starts_are_refused_across_machines(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """4 processes on 2 machines (torchrun's LOCAL_WORLD_SIZE 2): a server on the main process's 127.0.0.1 is out of
    the other machine's reach."""
    for name, value in (("WORLD_SIZE", "4"), ("LOCAL_WORLD_SIZE", "2"), ("RANK", "0")):
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as ended:
        train.main([LETTERS, "--model", str(tiny_model_dir), "--env-server", "python -m ep_trl.envs.letters --port "
                    "{port}", "--env-url-var", "LETTERS_ENV_URL"])  # fmt: skip
    assert ended.value.code == 2
    err = capsys.readouterr().err
    assert "--env-server under 4 processes on 2 machines: the main process starts it on 127.0.0.1" in err
    assert "--env-base-url URL1,URL2,..." in err


@pytest.mark.timeout(600)
def test_two_processes_train_in_process_on_one_environment_server(tiny_model_dir: Path, tmp_path: Path) -> None:
    """In-process generation: the main process starts the ``--env-server`` (one server, its URL sent to the other
    process), and each process plays its own groups on it; each episode is logged once."""
    folder, home = tmp_path / "run", tmp_path / "home"
    output = torchrun(
        [
            *small_run(tiny_model_dir, folder),
            "--env-server",
            "python -m ep_trl.envs.letters --port {port}",
            "--env-url-var",
            "LETTERS_ENV_URL",
        ],
        home,
    )
    episodes = STEPS * 2 * PER_PROCESS
    assert_one_run_folder(folder, output, episodes)
    assert len(re.findall(r"Starting python on 127\.0\.0\.1:\d+: .* -m ep_trl\.envs\.letters", output)) == 1
    assert len(re.findall(r"^environment server: ", output, flags=re.M)) == 1
    rows = final_rows(home)
    assert len(rows) == episodes  # each episode once, with its own rollout id
    by_process = Counter(row.execution_metadata.invocation_id for row in rows)
    assert sorted(by_process.values()) == [episodes // 2] * 2  # one rollout function per process, half each
    assert all(row.execution_metadata.extra["ep_trl"]["status"] == "finished" for row in rows)
    for step in range(STEPS):  # each process played one whole group per step
        groups = Counter(
            (row.execution_metadata.invocation_id, row.execution_metadata.extra["ep_trl"]["group"])
            for row in rows
            if row.execution_metadata.run_id == f"step-{step}"
        )
        assert sorted(groups.values()) == [GROUP, GROUP], groups


def assert_sampled_text_reached_the_environment(rows: list, received: list[dict]) -> None:
    """Token-exactness across processes: every action the environment received is an assistant turn a row holds,
    and every assistant turn was received, as many times (text decoded from the sampled ids, nothing re-made)."""
    sent = Counter(
        str(message.content).strip() for row in rows for message in row.messages if message.role == "assistant"
    )
    assert sent == Counter(action.strip() for episode in received for action in episode["actions"])


@pytest.mark.timeout(600)
def test_two_processes_train_on_one_vllm_server(
    sharp_model_dir: Path, shared_vllm_url: str, letters_episodes: "LettersEpisodes", tmp_path: Path
) -> None:
    """The server path (``DiskSyncGRPOTrainer`` on CPU): both processes generate on the server the main process
    keeps on the trainer's weights."""
    folder, home = tmp_path / "run", tmp_path / "home"
    output = torchrun(
        [*small_run(sharp_model_dir, folder), "--vllm-server-url", shared_vllm_url],
        home,
        env={"LETTERS_ENV_URL": os.environ["LETTERS_ENV_URL"]},
    )
    episodes = STEPS * 2 * PER_PROCESS
    assert_one_run_folder(folder, output, episodes)
    rows = final_rows(home)
    assert len(rows) == episodes and len({row.execution_metadata.invocation_id for row in rows}) == 2
    assert_sampled_text_reached_the_environment(rows, letters_episodes())


@pytest.mark.timeout(600)
def test_two_processes_train_async_from_the_main_processs_worker(
    sharp_model_dir: Path, shared_vllm_url: str, letters_episodes: "LettersEpisodes", tmp_path: Path
) -> None:
    """``--async``: TRL's async trainer takes its samples from the main process's worker alone and hands each process
    its batches; the other process builds no worker (one rollout function, one invocation in the store)."""
    folder, home = tmp_path / "run", tmp_path / "home"
    output = torchrun(
        [*small_run(sharp_model_dir, folder), "--async", "--vllm-server-url", shared_vllm_url],
        home,
        env={"LETTERS_ENV_URL": os.environ["LETTERS_ENV_URL"]},
    )
    assert_one_run_folder(folder, output, STEPS * 2 * PER_PROCESS)
    rows = final_rows(home)
    assert len({row.execution_metadata.invocation_id for row in rows}) == 1  # the main process's worker alone
    assert len(rows) >= STEPS * 2 * PER_PROCESS
    assert_sampled_text_reached_the_environment(rows, letters_episodes())
