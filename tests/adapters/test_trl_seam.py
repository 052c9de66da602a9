"""The TRL seam: the rollout_func signature, what is read off a GRPOTrainer, and the TRL versions each path takes."""

import inspect
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, cast

import pytest
from trl import GRPOConfig

from ep_trl.adapters import trl_seam
from ep_trl.adapters.trl_seam import GRPOTrainerCaller, caller_of
from ep_trl.generation import SyncedServer

if TYPE_CHECKING:
    from trl import GRPOTrainer


def _trainer(args: GRPOConfig, **attributes: object) -> "GRPOTrainer":
    """What GRPOTrainerCaller reads of a GRPOTrainer before any call is made: its args and processing class."""
    return cast("GRPOTrainer", SimpleNamespace(args=args, processing_class=None, **attributes))


def test_only_the_trainer_signature_is_taken(tmp_path: Path) -> None:
    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to=[])
    # the three-argument (prompts, args, processing_class) signature of TRL < 0.26 is outside the supported range
    with pytest.raises(TypeError, match="prompts, trainer"):
        caller_of((args, None))  # type: ignore[arg-type]  # the old signature, refused


def test_the_trainers_vllm_mode_picks_its_server_or_its_colocated_engine(tmp_path: Path) -> None:
    server = GRPOConfig(
        output_dir=str(tmp_path),
        use_cpu=True,
        use_vllm=True,
        vllm_mode="server",
        vllm_server_host="127.0.0.9",
        vllm_server_port=8123,
        report_to=[],
    )
    assert GRPOTrainerCaller(_trainer(server)).synced_server() == SyncedServer("http://127.0.0.9:8123")
    assert GRPOTrainerCaller(_trainer(server)).colocated_trainer() is None
    client = SimpleNamespace(base_url="http://10.0.0.1:8000/", model="Qwen/x")  # TRL's VLLMClient, once built
    with_client = _trainer(server, vllm_generation=SimpleNamespace(vllm_client=client))
    assert GRPOTrainerCaller(with_client).synced_server() == SyncedServer("http://10.0.0.1:8000", "Qwen/x")
    colocate = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, use_vllm=True, vllm_mode="colocate", report_to=[])
    trainer = _trainer(colocate)
    assert GRPOTrainerCaller(trainer).synced_server() is None
    assert GRPOTrainerCaller(trainer).colocated_trainer() is trainer
    plain = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to=[])
    assert GRPOTrainerCaller(_trainer(plain)).synced_server() is None
    assert GRPOTrainerCaller(_trainer(plain)).colocated_trainer() is None


def test_a_trainer_takes_rollout_images_only_when_its_class_says_so(tmp_path: Path) -> None:
    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to=[])

    class ImageTrainer(SimpleNamespace):
        takes_rollout_images = True

    assert GRPOTrainerCaller(_trainer(args)).takes_rollout_images is False
    assert (
        GRPOTrainerCaller(cast("GRPOTrainer", ImageTrainer(args=args, processing_class=None))).takes_rollout_images
        is True
    )


def test_metrics_reach_the_trainers_metric_store(tiny_model_dir: Path, tmp_path: Path) -> None:
    """GRPOTrainer keeps logged metrics in the private ``_metrics``; fail loudly if TRL renames it."""
    from ep_trl import create_openenv_vllm_rollout_func
    from tests.support.trainers import make_trainer

    rollout = create_openenv_vllm_rollout_func("tests.evals.eval_letters")
    trainer = make_trainer(tiny_model_dir, tmp_path, rollout)
    rollout.close()
    assert isinstance(trainer._metrics, dict) and "train" in trainer._metrics, "TRL renamed GRPOTrainer._metrics"
    caller = caller_of((trainer,))
    caller.record_metrics({"ep_trl/x": 1.5})
    assert trainer._metrics["train"]["ep_trl/x"] == [1.5]
    assert caller.step == 0 and caller.num_processes == 1 and caller.process_index == 0


def test_every_path_past_trls_stable_api_accepts_the_trl_it_is_tested_with() -> None:
    for path in trl_seam.TESTED_TRL:
        assert str(trl_seam.require_tested(path, "this path")).startswith("1.16.")


def test_a_path_past_trls_stable_api_refuses_an_untested_trl_when_it_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
    """TRL 1.18 removed the experimental async modules these paths import: a user on it is told at construction (or, for
    the module that subclasses TRL's experimental trainer, at import) which TRL the path is tested with and how to
    install it, not shown an ImportError from deep inside TRL."""
    import importlib

    from packaging.version import Version

    import ep_trl.trainers.async_images
    import ep_trl.trainers.cpu_async
    from ep_trl.adapters.async_worker import EvalRolloutWorker
    from ep_trl.errors import VersionError
    from ep_trl.trainers.cpu_colocate import CPUColocateGRPOTrainer
    from ep_trl.trainers.disk_sync import DiskSyncGRPOTrainer
    from ep_trl.trainers.images import RolloutImagesGRPOTrainer

    monkeypatch.setattr(trl_seam, "installed_version", lambda name: Version("1.18.0"))  # a TRL not installable here
    # the constructors refuse the TRL before they read their arguments: None stands in for each
    builds = {
        "EvalRolloutWorker": lambda: EvalRolloutWorker(
            "tests.evals.eval_letters",
            args=None,  # type: ignore[arg-type]  # refused first
            processing_class=None,  # type: ignore[arg-type]  # refused first
        ),
        # imported before TRL's experimental module, which TRL 1.18 removed: refused at import
        "ep_trl.trainers.cpu_async": lambda: importlib.reload(ep_trl.trainers.cpu_async),
        "DiskSyncGRPOTrainer": lambda: DiskSyncGRPOTrainer(None, None, None),  # type: ignore[arg-type]  # refused first
        "CPUColocateGRPOTrainer": lambda: CPUColocateGRPOTrainer(None, None, None),  # type: ignore[arg-type]  # refused first
        "RolloutImagesGRPOTrainer": lambda: RolloutImagesGRPOTrainer(),
        "ep_trl.trainers.async_images": lambda: importlib.reload(ep_trl.trainers.async_images),
        "AsyncImagesGRPOTrainer": lambda: ep_trl.trainers.async_images.AsyncImagesGRPOTrainer(
            None,  # type: ignore[arg-type]  # refused first
            processing_class=None,  # type: ignore[arg-type]  # refused first
        ),
    }
    for who, build in builds.items():
        with pytest.raises(
            VersionError,
            match=rf"{who} is tested with TRL >=1.16,<1.17 only, and TRL 1\.18\.0 is "
            r"installed: .*pip install 'trl>=1.16,<1.17'.*"
            r"GRPOTrainer\(rollout_func=.*works with TRL >=1.16,<2",
        ):
            build()
    assert str(trl_seam.check_version()).startswith("1.16.")  # the rollout_func path keeps the declared range


def test_the_lora_adapter_names_are_async_grpo_trainers_own_and_only_for_the_tested_trl(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """AsyncGRPOTrainer loads each synced adapter as f"{self._lora_name}-v{version}", a private name set in its
    constructor; ep_trl knows it for the TRL its async path is tested with, and refuses to guess for another."""
    from packaging.version import Version
    from trl.experimental.async_grpo.async_grpo_trainer import AsyncGRPOTrainer

    from ep_trl.errors import VersionError

    source = inspect.getsource(AsyncGRPOTrainer)
    assert f'self._lora_name = "{trl_seam._ASYNC_LORA_NAME}"' in source, "TRL renamed its LoRA adapters"
    assert 'load_lora_adapter(f"{self._lora_name}-v{version}"' in source
    assert trl_seam.async_lora_adapter(3) == "trl-policy-v3"
    monkeypatch.setattr(trl_seam, "installed_version", lambda name: Version("1.18.0"))
    with pytest.raises(VersionError, match=r"LoRA adapter names.*TRL 1\.18\.0 is installed"):
        trl_seam.async_lora_adapter(3)
