"""Who calls a rollout: the trainer's configuration read once, and the caller without a trainer in reach."""

import math
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING

import numpy
import pytest
from transformers import AutoTokenizer
from trl import GRPOConfig

from ep_trl.engine.caller import DetachedCaller, TrainingConfig
from ep_trl.errors import ConfigError
from ep_trl.generation import SyncedServer

if TYPE_CHECKING:
    from typing import SupportsFloat


def test_the_configuration_is_read_from_the_grpo_config(tiny_model_dir: Path, tmp_path: Path) -> None:
    """TRL's loss assumes samples at the config's temperature, top-p and top-k: those are what rollouts sample with."""
    args = GRPOConfig(
        output_dir=str(tmp_path),
        use_cpu=True,
        temperature=0.7,
        top_p=0.9,
        top_k=5,
        num_generations=4,
        max_completion_length=96,
        per_device_train_batch_size=4,
        use_vllm=True,
        vllm_mode="colocate",
        report_to=[],
    )
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    config = TrainingConfig.of(args, tok)
    assert (config.sampling.temperature, config.sampling.top_p, config.sampling.top_k) == (0.7, 0.9, 5)
    assert (config.num_generations, config.max_completion_length, config.vllm_mode) == (4, 96, "colocate")
    assert config.tokenizer is tok
    assert TrainingConfig.of(GRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to=[]), tok).vllm_mode is None


def test_a_detached_caller_generates_on_its_server_and_hands_metrics_to_its_sink(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    config = TrainingConfig.of(GRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to=[]), tok)
    got: dict[str, float] = {}
    caller = DetachedCaller(config, 7, SyncedServer("http://127.0.0.1:8011"), got.update)
    assert caller.step == 7 and caller.synced_server() == SyncedServer("http://127.0.0.1:8011")
    # typed to return None: the test checks a detached caller answers that at run time too
    assert caller.colocated_trainer() is None and caller.model_provider() is None  # type: ignore[func-returns-value]
    assert caller.takes_rollout_images is False
    caller.record_metrics({"ep_trl/x": 1.0})
    assert got == {"ep_trl/x": 1.0}


@pytest.mark.parametrize("temperature", [0.0, -0.5])
def test_a_non_positive_temperature_is_refused_not_sampled_at_1(
    tiny_model_dir: Path, tmp_path: Path, temperature: float
) -> None:
    """Issue 33: temperature=0 was read as 1.0, so a config that asked for greedy samples trained on T=1 ones."""
    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, temperature=temperature, report_to=[])
    with pytest.raises(ConfigError, match=rf"GRPOConfig\(temperature={temperature}\).*must be a finite number > 0"):
        TrainingConfig.of(args, AutoTokenizer.from_pretrained(tiny_model_dir))


def config_with_temperature(tmp_path: Path, temperature: object) -> GRPOConfig:
    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to=[])
    args.temperature = temperature  # type: ignore[assignment]  # set as a sweep would, after GRPOConfig's own checks
    return args


@pytest.mark.parametrize("temperature", [numpy.float32(0.7), numpy.float64(0.7), Fraction(7, 10), 2], ids=repr)
def test_a_temperature_of_any_real_number_type_is_read_as_a_float(tmp_path: Path, temperature: "SupportsFloat") -> None:
    """Issue 40: numpy.float32(0.7) (a config filled from a numpy sweep) was refused as not a number."""
    sampled_at = TrainingConfig.of(config_with_temperature(tmp_path, temperature), None).sampling.temperature  # type: ignore[arg-type]  # sampling only
    assert type(sampled_at) is float and sampled_at == pytest.approx(float(temperature))


@pytest.mark.parametrize("temperature", ["0.7", True, numpy.bool_(True), math.nan, math.inf, 0.7j], ids=repr)
def test_a_temperature_that_is_no_finite_real_number_is_refused_with_what_to_set(
    tmp_path: Path, temperature: object
) -> None:
    with pytest.raises(ConfigError, match=r"GRPOConfig\(temperature=.*\).*must be a finite number > 0 \(TRL's default"):
        TrainingConfig.of(config_with_temperature(tmp_path, temperature), None)  # type: ignore[arg-type]  # refused first


def test_a_vllm_mode_trl_does_not_have_is_refused_where_it_is_read(tmp_path: Path) -> None:
    """Issue 41: a mode other than 'server' or 'colocate' was kept as a string, and read as "not server" further on
    (no synced server, no colocated engine) instead of refused."""
    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to=[], use_vllm=True)
    args.vllm_mode = "collocate"  # a typo, set after GRPOConfig's own checks
    with pytest.raises(ConfigError, match=r"GRPOConfig\(vllm_mode='collocate'\).*'server'.*'colocate'"):
        TrainingConfig.of(args, None)  # type: ignore[arg-type]  # refused first
