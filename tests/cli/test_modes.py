"""The recipes' generation flags (``ep_trl.cli.add_generation_flags``, in recipes/letters/tiny.py and
train_browsergym_trl.py): each combination no mode trains with is refused by argparse with a message naming the
problem and the fix, before anything starts; the accepted ones give the config of their mode. No training here (the
recipe runs are in tests/project/test_train_letters_script.py and tests/colocate; LoRA against a server with
--enable-lora in tests/adapters/test_async_worker.py)."""

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

from ep_trl.cli import modes as training_modes

ROOT = Path(__file__).resolve().parents[2]
URL = "http://127.0.0.1:8011"


def script(path: str) -> ModuleType:
    """A recipe (``recipes/TASK/MODEL``) or the main job (``train_browsergym_trl``), imported from its file."""
    spec = importlib.util.spec_from_file_location(path.replace("/", "_"), ROOT / f"{path}.py")
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def letters() -> ModuleType:
    return script("recipes/letters/tiny")


@pytest.fixture(scope="module")
def browsergym() -> ModuleType:
    return script("train_browsergym_trl")


@pytest.fixture
def cpu_with_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CPU machine whose Python has vLLM (.venv-colocate)."""
    monkeypatch.setattr(training_modes, "vllm_importable", lambda: True)
    monkeypatch.setattr(training_modes, "cuda_available", lambda: False)


def refused(module: ModuleType, argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        module.parse_args(argv)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("name", ["letters", "browsergym"])
@pytest.mark.parametrize(
    "argv, message",
    [
        pytest.param(
            ["--vllm-mode", "colocate", "--vllm-base-url", URL],
            r"--vllm-mode colocate generates with a vLLM engine inside the training process, not on a server: "
            r"drop --vllm-server-url",
            id="colocate-with-a-server",
        ),
        pytest.param(
            ["--vllm-gpu-memory-utilization", "0.5"],
            r"--vllm-gpu-memory-utilization sizes the colocated engine: add --vllm-mode colocate, or drop it",
            id="memory-share-without-colocate",
        ),
        pytest.param(
            ["--async"],
            r"--async needs --vllm-server-url URL.*`trl vllm-serve --model M`.*"
            r"\.venv-vllm/bin/python -m vllm\.entrypoints\.openai\.api_server",
            id="async-without-a-server",
        ),
        pytest.param(
            ["--async", "--vllm-base-url", URL],
            r"--async needs --model: the model the server at http://127\.0\.0\.1:8011 was started on.*"
            r"build_tiny_model",
            id="async-without-a-model",
        ),
        pytest.param(
            ["--async", "--vllm-mode", "colocate", "--vllm-base-url", URL, "--model", "m"],
            r"--async generates on a vLLM server .* drop --vllm-mode colocate",
            id="async-colocated",
        ),
    ],
)
def test_a_combination_no_mode_trains_with_is_an_argparse_error(
    name: str,
    argv: list[str],
    message: str,
    request: pytest.FixtureRequest,
    capsys: pytest.CaptureFixture[str],
    cpu_with_vllm: None,
) -> None:
    err = refused(request.getfixturevalue(name), argv, capsys)
    assert re.search(message, err), err


def test_colocate_without_vllm_names_the_colocate_venv(
    letters: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(training_modes, "vllm_importable", lambda: False)
    err = refused(letters, ["--vllm-mode", "colocate"], capsys)
    assert (
        "this Python has no vllm module. On CPU: `bash scripts/install_colocate.sh`, then run the script with "
        ".venv-colocate/bin/python" in err
    )


def test_colocate_with_lora_on_cpu_is_refused(
    browsergym: ModuleType, cpu_with_vllm: None, capsys: pytest.CaptureFixture[str]
) -> None:
    err = refused(browsergym, ["--vllm-mode", "colocate", "--lora-r", "4"], capsys)
    assert "CPUColocateGRPOTrainer, which does not support LoRA" in err and "drop --lora-r" in err


def test_colocate_with_screenshots_on_cpu_is_refused(
    browsergym: ModuleType, cpu_with_vllm: None, capsys: pytest.CaptureFixture[str]
) -> None:
    err = refused(browsergym, ["--vllm-mode", "colocate", "--screenshots"], capsys)
    assert "does not put rollout images into the loss: drop --screenshots" in err


def test_async_with_screenshots_and_lora_is_refused(
    browsergym: ModuleType, cpu_with_vllm: None, capsys: pytest.CaptureFixture[str]
) -> None:
    err = refused(
        browsergym, ["--async", "--vllm-base-url", URL, "--model", "m", "--screenshots", "--lora-r", "4"], capsys
    )
    assert "AsyncImagesGRPOTrainer was not tested with a LoRA policy; drop --lora-r" in err


def test_async_with_screenshots_trains_with_the_images_trainer(
    browsergym: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """On a GPU too, rows with images are planned by sample count (token_budget=0), as AsyncImagesGRPOTrainer
    requires; the mode names the images trainer."""
    from trl.experimental.async_grpo import AsyncGRPOConfig

    monkeypatch.setattr(training_modes, "cuda_available", lambda: True)
    args = browsergym.parse_args(["--async", "--vllm-base-url", URL, "--model", "m", "--screenshots"])
    mode = training_modes.TrainingMode.from_args(args)
    assert mode.images and "AsyncImagesGRPOTrainer, NCCL weight transfer" in mode.describe()
    monkeypatch.setattr(training_modes, "cuda_available", lambda: False)
    mode = training_modes.TrainingMode.from_args(args)
    assert "CPUAsyncImagesGRPOTrainer" in mode.describe()
    config = mode.config(output_dir=str(tmp_path), bf16=False, report_to=[])
    assert isinstance(config, AsyncGRPOConfig) and config.token_budget == 0


def test_each_mode_gets_its_config_on_cpu(
    letters: ModuleType, browsergym: ModuleType, cpu_with_vllm: None, tmp_path: Path
) -> None:
    """Colocate: TRL's engine in the trainer at the default memory share; async: an AsyncGRPOConfig on the server,
    with fixed-size packing (CPU); a server without --async on CPU: TRL's server mode, which DiskSyncGRPOTrainer keeps
    on the trainer's weights through disk (NCCL needs a GPU)."""
    from trl import GRPOConfig
    from trl.experimental.async_grpo import AsyncGRPOConfig

    def config(module: ModuleType, argv: list[str]) -> "GRPOConfig | AsyncGRPOConfig":
        mode = training_modes.TrainingMode.from_args(module.parse_args(argv))
        return mode.config(output_dir=str(tmp_path), bf16=False, report_to=[])

    colocate = config(letters, ["--vllm-mode", "colocate"])
    assert isinstance(colocate, GRPOConfig) and colocate.use_cpu and colocate.use_vllm
    assert colocate.vllm_mode == "colocate" and colocate.vllm_gpu_memory_utilization == 0.3
    lora_async = config(browsergym, ["--async", "--vllm-base-url", URL, "--model", "m", "--lora-r", "4"])
    assert isinstance(lora_async, AsyncGRPOConfig) and lora_async.use_cpu and lora_async.token_budget == 0
    assert lora_async.vllm_server_base_url == URL
    server = config(letters, ["--vllm-base-url", URL])
    assert isinstance(server, GRPOConfig) and server.use_cpu and server.use_vllm and server.vllm_mode == "server"
    assert server.vllm_server_base_url == URL


@pytest.mark.parametrize(
    "flag, message",
    [
        ("--lora-r", r"DiskSyncGRPOTrainer, which does not support LoRA .*add --async"),
        ("--screenshots", r"DiskSyncGRPOTrainer, which does not support rollout images in the loss: add --async"),
    ],
)
def test_a_synced_server_on_cpu_with_lora_or_screenshots_is_refused(
    browsergym: ModuleType, cpu_with_vllm: None, capsys: pytest.CaptureFixture[str], flag: str, message: str
) -> None:
    """DiskSyncGRPOTrainer merges no adapter and puts no image into the loss: refused before anything starts."""
    argv = ["--vllm-base-url", URL, flag] + (["4"] if flag == "--lora-r" else [])
    assert re.search(message, refused(browsergym, argv, capsys))
