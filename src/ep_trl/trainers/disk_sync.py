"""``DiskSyncGRPOTrainer``: ``GRPOTrainer(use_vllm=True, vllm_mode="server")`` on CPU.

TRL pushes weights to ``trl vllm-serve`` over NCCL, which needs CUDA on both
ends: on a CPU machine ``GRPOTrainer(use_vllm=True, vllm_mode="server")`` fails in ``__init__``. vLLM's
development endpoint ``POST /collective_rpc`` (served when ``VLLM_SERVER_DEV_MODE=1``, which ``trl vllm-serve``
sets) can run the worker's ``reload_weights(weights_path=DIR)``: it loads the safetensors in DIR into the running
model in place. For a small model on one machine that takes well under a second, so a CPU development run can use
the server path on-policy: :class:`DiskSyncGRPOTrainer` is a ``GRPOTrainer`` whose weight sync does exactly that,
and everything else (``rollout_func`` called after each sync, TRL's importance-sampling correction against the
server's logprobs) stays TRL's own.

Use it for development and CI on CPU, or any single machine where TRL's GPU paths are unavailable. On GPUs use plain
``GRPOTrainer`` (see docs/vllm.md).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

from trl import GRPOTrainer

from ..adapters import trl_seam
from ..errors import ConfigError, VersionError
from ..generation.probe import probe_server
from .disk_weights import DiskWeightSync

if TYPE_CHECKING:
    import torch
    from peft import PeftModel
    from transformers import PreTrainedModel
    from transformers.trainer_utils import TrainOutput
    from trl import GRPOConfig
    from trl.trainer.grpo_trainer import RewardFunc

logger = logging.getLogger(__name__)


class _ServerClientInfo:
    """Where ep_trl's rollout function looks for the trainer's server (``vllm_generation.vllm_client``)."""

    def __init__(self, base_url: str, model: str) -> None:
        self.base_url = base_url
        self.model = model


class _ServerClient(Protocol):
    @property
    def base_url(self) -> str: ...


class _VLLMGenerationStandIn(Protocol):
    """What :func:`attach_vllm_generation` puts where ``GRPOTrainer`` keeps TRL's ``VLLMGeneration``."""

    @property
    def vllm_client(self) -> _ServerClient: ...

    def sync_weights(self) -> None: ...


class DiskSyncedVLLMServer:
    """Stands where ``GRPOTrainer`` keeps TRL's ``VLLMGeneration``: it syncs weights through disk, never generates."""

    def __init__(
        self,
        base_url: str,
        model_provider: Callable[[], torch.nn.Module],
        is_main_process: bool,
        sync: DiskWeightSync,
        step_provider: Callable[[], int],
        model_name: str,
    ) -> None:
        self.vllm_client = _ServerClientInfo(base_url, model_name)
        self._model_provider = model_provider
        self._is_main = is_main_process
        self._sync = sync
        self._step = step_provider

    @property
    def weight_sync(self) -> DiskWeightSync:
        return self._sync

    def sync_weights(self) -> None:
        """Called by ``GRPOTrainer._generate`` before ``rollout_func`` whenever the global step changed."""
        if self._is_main:
            self._sync.push(self._model_provider(), self._step())

    def generate(self, *args: object, **kwargs: object) -> NoReturn:
        raise ConfigError("DiskSyncGRPOTrainer generates only through a rollout_func (ep_trl's); pass rollout_func=...")


class DiskSyncGRPOTrainer(GRPOTrainer):
    """``GRPOTrainer(use_vllm=True, vllm_mode="server")`` that syncs weights to the server through disk.

    Use it where TRL's NCCL sync is unavailable (CPU development, CI) with a vLLM server on the same machine
    started with ``VLLM_SERVER_DEV_MODE=1``::

        args = GRPOConfig(..., use_vllm=True, vllm_mode="server", vllm_server_base_url="http://127.0.0.1:8011")
        trainer = DiskSyncGRPOTrainer(model=..., reward_funcs=[eval_score], args=args, train_dataset=...,
                                      rollout_func=create_openenv_vllm_rollout_func(env_path))

    Before every ``rollout_func`` call in which the global step changed (and before the first), the main
    process writes the policy's weights to ``vllm_weights_dir`` (default: a temporary directory, deleted when
    training ends) and the server reloads them, so rollouts are on-policy and TRL's importance-sampling
    correction compares like with like. When ``train()`` returns, the server holds the trained weights (the last
    step's are pushed then), so the same server can score the trained model. Single process or DDP only (weights are
    written from the main process's replica).
    """

    def __init__(
        self,
        model: str | PreTrainedModel | PeftModel,
        reward_funcs: RewardFunc | list[RewardFunc] | None,
        args: GRPOConfig | None,
        *more: Any,
        vllm_weights_dir: str | Path | None = None,
        **kwargs: Any,
    ) -> None:
        trl_seam.require_tested("cpu-trainers", "DiskSyncGRPOTrainer")
        if args is None or not getattr(args, "use_vllm", False) or getattr(args, "vllm_mode", None) != "server":
            raise ConfigError(
                "DiskSyncGRPOTrainer needs GRPOConfig(use_vllm=True, vllm_mode='server', vllm_server_base_url=...)."
            )
        if kwargs.get("rollout_func") is None:
            raise ConfigError(
                "DiskSyncGRPOTrainer generates only through a rollout_func; pass "
                "rollout_func=create_openenv_vllm_rollout_func(...)."
            )
        if kwargs.get("peft_config") is not None:
            raise ConfigError(
                "DiskSyncGRPOTrainer does not support peft_config (adapters are not merged before weights are written)."
            )
        base_url = (args.vllm_server_base_url or f"http://{args.vllm_server_host}:{args.vllm_server_port}").rstrip("/")
        info = probe_server(base_url, 10.0)
        self.weight_sync = DiskWeightSync(base_url, vllm_weights_dir)
        self.weight_sync.check_server()
        with trl_vllm_client_skipped(args):
            super().__init__(model, reward_funcs, args, *more, **kwargs)
        if uses_sharded_parameters(self):
            raise ConfigError(
                "DiskSyncGRPOTrainer writes the main process's replica, but FSDP / DeepSpeed ZeRO-3 shard "
                "parameters. Use DDP, or TRL's NCCL sync on GPUs."
            )
        server = DiskSyncedVLLMServer(
            base_url,
            trl_seam.GRPOTrainerCaller(self).model_provider(),
            self.accelerator.is_main_process,
            self.weight_sync,
            lambda: int(self.state.global_step),
            info.model,
        )
        attach_vllm_generation(self, server)
        logger.warning(
            "DiskSyncGRPOTrainer: weights reach the vLLM server at %s through %s (save + reload before each step's "
            "rollouts), not NCCL: fine for small models on one machine, slow for large ones.",
            base_url,
            self.weight_sync.directory,
        )

    def train(self, *args: Any, **kwargs: Any) -> TrainOutput:
        """TRL's training loop; when it ends normally the server gets the last optimizer step's weights too (TRL
        pushes before each rollout call, so the last step's would otherwise never reach it), so that what the server
        serves after ``train()`` is the trained model."""
        try:
            result = super().train(*args, **kwargs)
            if self._last_loaded_step != self.state.global_step:
                self.vllm_generation.sync_weights()
                self._last_loaded_step = self.state.global_step
            return result
        finally:
            self.weight_sync.close()


@contextmanager
def trl_vllm_client_skipped(args: GRPOConfig) -> Iterator[None]:
    """Build a ``GRPOTrainer`` whose config asks for ``use_vllm=True`` without TRL's own vLLM client.

    ``GRPOTrainer.__init__`` builds ``VLLMGeneration`` when ``args.use_vllm``; in server mode that creates TRL's
    ``VLLMClient`` (which refuses unless ``vllm`` is importable in the trainer's environment) and calls
    ``init_communicator`` (NCCL, CUDA only). Inside this block ``args.use_vllm`` reads False; afterwards it is
    True again and :func:`attach_vllm_generation` puts a replacement in place.
    """
    if not getattr(args, "use_vllm", False) or getattr(args, "vllm_mode", "server") != "server":
        raise VersionError("expected a GRPOConfig with use_vllm=True and vllm_mode='server'")
    args.use_vllm = False
    try:
        yield
    finally:
        args.use_vllm = True


def attach_vllm_generation(trainer: GRPOTrainer, generation: _VLLMGenerationStandIn) -> None:
    """Make a ``GRPOTrainer`` built under :func:`trl_vllm_client_skipped` behave as ``use_vllm=True`` in server mode.

    GRPOTrainer 1.16 reads ``use_vllm`` / ``vllm_mode`` off the trainer (not its args) in ``_generate`` (weight
    sync via ``vllm_generation.sync_weights()`` when ``_last_loaded_step`` differs from the global step) and in
    the loss (importance-sampling correction against the ``logprobs`` rollout_func returns). ``generation`` must
    offer ``sync_weights()`` and ``vllm_client.base_url``. ``tests/generation/test_vllm_real.py`` (DiskSyncGRPOTrainer
    steps with TRL's logprob-difference metric) fails when TRL renames or stops reading any of these.
    """
    for name in ("use_vllm", "vllm_mode", "_metrics"):
        if not hasattr(trainer, name):
            raise VersionError(
                f"GRPOTrainer in this TRL version has no attribute {name!r}; ep_trl's server weight sync cannot "
                "attach. "
                "Use GRPOConfig(use_vllm=False) with create_openenv_vllm_rollout_func(vllm_base_url=...) instead."
            )
    trainer.use_vllm = True
    trainer.vllm_mode = "server"
    setattr(trainer, "vllm_generation", generation)  # a stand-in for TRL's VLLMGeneration, not one
    trainer._last_loaded_step = -1  # as GRPOTrainer.__init__ sets it: the first rollout call syncs


def sync_vllm_weights(trainer: object) -> None:
    """Bring the trainer's vLLM engine (its server, or its colocated engine) onto its current weights, as
    ``GRPOTrainer`` does before it generates (``_last_loaded_step``, ``vllm_generation.sync_weights()``): the last
    optimizer step's weights reach it only at the next generation, and held-out play after training must not use the
    step before. Nothing to do for a trainer that generates in-process or is already in sync."""
    if not getattr(getattr(trainer, "args", None), "use_vllm", False):
        return
    step = getattr(getattr(trainer, "state", None), "global_step", 0)
    last = getattr(trainer, "_last_loaded_step", None)
    generation = getattr(trainer, "vllm_generation", None)
    if last is None or generation is None:
        raise VersionError(
            "this TRL's GRPOTrainer has no _last_loaded_step or vllm_generation: ep_trl cannot bring "
            "its vLLM engine onto the trained weights before held-out play; install the TRL that "
            "pyproject.toml pins"
        )
    if last != step:
        generation.sync_weights()
        trainer._last_loaded_step = step  # type: ignore[attr-defined]


def uses_sharded_parameters(trainer: object) -> bool:
    """Whether the trainer shards parameters across processes (FSDP or DeepSpeed ZeRO-3), so that no single
    process holds the full weights."""
    accelerator = getattr(trainer, "accelerator", None)
    state = getattr(accelerator, "state", None)
    if getattr(state, "fsdp_plugin", None) is not None:
        return True
    deepspeed = getattr(state, "deepspeed_plugin", None)
    return getattr(deepspeed, "zero_stage", 0) == 3
