"""The tests' device switch: ``EP_TRL_TEST_DEVICE`` puts the test trainers on CUDA, and refuses quietly running on
the CPU when asked for a GPU that is not there."""

from pathlib import Path

import pytest
import torch

from tests.support.device import DEVICE_VARIABLE, device_under_test, trainer_on_cpu
from tests.support.references import teacher_forced_logprobs
from tests.support.trainers import make_trainer


def test_the_default_is_the_cpu(monkeypatch: pytest.MonkeyPatch, tiny_model_dir: Path, tmp_path: Path) -> None:
    monkeypatch.delenv(DEVICE_VARIABLE, raising=False)
    assert device_under_test() == "cpu" and trainer_on_cpu()
    trainer = make_trainer(tiny_model_dir, tmp_path, rollout_func=lambda prompts, trainer: {})
    assert trainer.model is not None
    assert trainer.args.use_cpu and trainer.model.device.type == "cpu"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_cuda_without_a_gpu_is_an_error_not_a_cpu_run(
    monkeypatch: pytest.MonkeyPatch, tiny_model_dir: Path, tmp_path: Path
) -> None:
    monkeypatch.setenv(DEVICE_VARIABLE, "cuda")
    with pytest.raises(RuntimeError, match="torch sees no GPU"):
        make_trainer(tiny_model_dir, tmp_path, rollout_func=lambda prompts, trainer: {})


def test_an_unknown_device_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DEVICE_VARIABLE, "tpu")
    with pytest.raises(ValueError, match="use one of"):
        device_under_test()


def test_reference_logprobs_are_computed_on_the_given_device(tiny_model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    on_model = teacher_forced_logprobs(model, [1, 2, 3], [4, 5])
    explicit = teacher_forced_logprobs(model, [1, 2, 3], [4, 5], device="cpu")
    assert len(on_model) == 2 and on_model == explicit
