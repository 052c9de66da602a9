"""The seam to ``GRPOTrainer`` as a caller: TRL's version, the ``rollout_func`` signature, and what a rollout call
reads off the trainer.

ep_trl supports the TRL range its ``pyproject.toml`` declares (``ep_trl.runtime.versions``), in which ``GRPOTrainer``
calls ``rollout_func(prompts, trainer)``; the paths that reach past TRL's stable API are tested with narrower ranges
(:data:`TESTED_TRL`). Attributes of the trainer that are not public API are read in :class:`GRPOTrainerCaller`,
behind a guard, and ``tests/adapters/test_trl_seam.py`` fails loudly when TRL renames them. The other places that touch
TRL's internals are the trainers that replace parts of TRL's (``ep_trl.trainers``) and the colocated engine's
handling (``ep_trl.generation.colocate``).
"""

from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from ..engine.caller import TrainingConfig
from ..errors import VersionError
from ..generation import SyncedServer
from ..runtime.versions import installed_version, require_supported, show, supported_range
from ..trajectory.types import Model, ProcessingClass

if TYPE_CHECKING:  # named for the checker: TRL is imported where a trainer is built
    from trl import GRPOTrainer


def check_version() -> Version:
    """Raise ``VersionError`` unless the installed TRL is in ep_trl's declared range; return its version."""
    return require_supported("trl")


#: The TRL versions each path that reaches past TRL's stable API is tested with (CI installs TRL 1.16.0), and what it
#: reaches for. Such a path refuses any other TRL when it is built; ``GRPOTrainer(rollout_func=...)`` is TRL's
#: stable API and accepts ep_trl's whole declared range (``pyproject.toml``).
TESTED_TRL: dict[str, tuple[str, str]] = {
    "async": (
        ">=1.16,<1.17",
        "it imports trl.experimental.async_grpo's internals (RolloutSample, packing, the trainer "
        "module), which TRL 1.18 removed when it made AsyncGRPOTrainer stable",
    ),
    "cpu-trainers": (
        ">=1.16,<1.17",
        "it replaces GRPOTrainer's weight sync to vLLM (trl.generation.vllm_generation internals)",
    ),
    "images": (">=1.16,<1.17", "it overrides GRPOTrainer's internal generation and forward-pass inputs"),
}


def require_tested(path: str, who: str) -> Version:
    """Raise ``VersionError`` unless the installed TRL is one ``path`` (a key of :data:`TESTED_TRL`) is tested with,
    naming the versions and the install command; return the installed version."""
    specifier, reaches = TESTED_TRL[path]
    version = installed_version("trl")
    if version not in SpecifierSet(specifier):
        raise VersionError(
            f"{who} is tested with TRL {show(SpecifierSet(specifier))} only, and TRL {version} is installed: "
            f"{reaches}. "
            f"Install the tested TRL with pip install 'trl{show(SpecifierSet(specifier))}'; "
            f"GRPOTrainer(rollout_func=ep_trl.create_rollout_func(...)) works with TRL {show(supported_range('trl'))}."
        )
    return version


#: The name ``AsyncGRPOTrainer`` loads each synced LoRA adapter under, ``f"{name}-v{version}"``: its private
#: ``_lora_name``, set in its constructor (no public way to read it before a trainer exists). Known for the TRL of
#: the "async" path only; pinned by tests/adapters/test_trl_seam.py and tests/adapters/test_async_worker.py.
_ASYNC_LORA_NAME = "trl-policy"


def async_lora_adapter(version: int) -> str:
    """The name ``AsyncGRPOTrainer`` loads policy ``version``'s LoRA adapter under on the vLLM server; raises
    ``VersionError`` for a TRL the async path is not tested with (the private name may differ there)."""
    require_tested("async", "EvalRolloutWorker (the LoRA adapter names AsyncGRPOTrainer loads)")
    return f"{_ASYNC_LORA_NAME}-v{version}"


def rollout_sample() -> type:
    """TRL's ``RolloutSample``, what ``AsyncGRPOTrainer`` trains from (``trl.experimental.async_grpo``'s, in the TRL
    of the "async" path: :data:`TESTED_TRL`)."""
    from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

    return RolloutSample


class GRPOTrainerCaller:
    """``GRPOTrainer`` as the caller of ``rollout_func(prompts, trainer)`` (``ep_trl.engine.caller.RolloutCaller``): the
    configuration read from ``trainer.args``, the rest read off the trainer when asked."""

    def __init__(self, trainer: "GRPOTrainer") -> None:
        self.trainer = trainer
        # GRPOTrainer loads a processing class when it was given none: a tokenizer or a multimodal processor
        self.config = TrainingConfig.of(trainer.args, cast(ProcessingClass, trainer.processing_class))

    @property
    def step(self) -> int:
        return int(getattr(getattr(self.trainer, "state", None), "global_step", 0) or 0)

    @property
    def process_index(self) -> int:
        return int(getattr(getattr(self.trainer, "accelerator", None), "process_index", 0) or 0)

    @property
    def num_processes(self) -> int:
        return int(getattr(getattr(self.trainer, "accelerator", None), "num_processes", 1) or 1)

    @property
    def model_name(self) -> str | None:
        name = getattr(getattr(self.trainer, "model", None), "name_or_path", None)
        return str(name) if name else None

    @property
    def takes_rollout_images(self) -> bool:
        """TRL 1.16's ``GRPOTrainer`` drops the ``images`` a rollout returns (its ``rollout_func`` branch sets
        ``images = None``); a trainer that puts them into its forward passes says so with the class attribute
        ``takes_rollout_images`` (``ep_trl.trainers.images.RolloutImagesGRPOTrainer``, pinned by
        ``tests/trainers/test_images.py``)."""
        return bool(getattr(type(self.trainer), "takes_rollout_images", False))

    @property
    def takes_processed_images(self) -> bool:
        """A trainer's forward passes process its rollouts' images themselves (``ep_trl.trajectory.vision_inputs``)."""
        return False

    def wait_for_weight_sync(self) -> None:
        """With several processes and ``vllm_mode="server"``, wait until every process reached ``rollout_func``.

        TRL pushes new weights to the server from the main process right before calling ``rollout_func`` there;
        the other processes reach their own call without waiting for that push. TRL's built-in generation is
        safe because it gathers all prompts first (a collective); a ``rollout_func`` that generates per process
        must synchronise the same way, or the other processes' first requests hit half-updated weights.
        """
        if self.num_processes <= 1 or self.config.vllm_mode != "server":
            return
        accelerator = getattr(self.trainer, "accelerator", None)
        if accelerator is not None:
            accelerator.wait_for_everyone()

    def model_provider(self) -> Callable[[], Model]:
        """The trainer's model, unwrapped from DDP/accelerate."""
        trainer = self.trainer

        def provide() -> Model:
            accelerator = getattr(trainer, "accelerator", None)
            model = accelerator.unwrap_model(trainer.model) if accelerator is not None else trainer.model
            return cast(Model, model)  # GRPOTrainer's policy: a transformers model (or a PEFT model around one)

        return provide

    def colocated_trainer(self) -> "GRPOTrainer | None":
        return self.trainer if self.config.vllm_mode == "colocate" else None

    def synced_server(self) -> SyncedServer | None:
        """The trainer's own vLLM server (``vllm_mode="server"``): its client's URL and model, else the config's."""
        if self.config.vllm_mode != "server":
            return None
        client = getattr(getattr(self.trainer, "vllm_generation", None), "vllm_client", None)
        url = getattr(client, "base_url", None)
        if client is not None and url is None:
            raise VersionError(
                "trainer.vllm_generation.vllm_client has no base_url in this TRL version; pass "
                "vllm_base_url=... explicitly."
            )
        if url is None:
            args = self.trainer.args
            url = getattr(args, "vllm_server_base_url", None) or (
                f"http://{getattr(args, 'vllm_server_host', '127.0.0.1')}:{getattr(args, 'vllm_server_port', 8000)}"
            )
        model = getattr(client, "model", None)
        return SyncedServer(str(url).rstrip("/"), str(model) if model else None)

    def record_metrics(self, metrics: dict[str, float]) -> None:
        """Add to the trainer's logged metrics (``trainer._metrics["train"]``), when it keeps them."""
        store = getattr(self.trainer, "_metrics", None)
        if not isinstance(store, dict) or "train" not in store:
            return
        for key, value in metrics.items():
            store["train"][key].append(value)


def caller_of(args: tuple["GRPOTrainer", ...]) -> GRPOTrainerCaller:
    """The caller of ``rollout_func(prompts, trainer)``, from the arguments after ``prompts``."""
    if len(args) != 1:
        raise TypeError(
            f"rollout_func expected (prompts, trainer), got {1 + len(args)} arguments; ep_trl supports "
            "the TRL versions that call it so (pip install -e . pins them)"
        )
    return GRPOTrainerCaller(args[0])
