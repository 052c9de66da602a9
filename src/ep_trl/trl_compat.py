"""The one seam to TRL: its version, the ``rollout_func`` signature, and what is read off the trainer.

ep_trl supports the TRL range its ``pyproject.toml`` declares (``ep_trl.versions``), in which ``GRPOTrainer``
calls ``rollout_func(prompts, trainer)``. Attributes of the trainer that are not public API are read here,
behind a guard, and ``tests/test_trl_compat.py`` fails loudly when TRL renames them.
"""

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from .errors import ConfigError, VersionError
from .generation import SamplingParams
from .versions import installed_version, require_supported, show, supported_range

logger = logging.getLogger(__name__)


def check_version() -> Version:
    """Raise ``VersionError`` unless the installed TRL is in ep_trl's declared range; return its version."""
    return require_supported("trl")


#: The TRL versions each path that reaches past TRL's stable API is tested with (CI installs TRL 1.16.0), and what it
#: reaches for. Such a path refuses any other TRL when it is built; ``GRPOTrainer(rollout_func=...)`` is TRL's
#: stable API and accepts ep_trl's whole declared range (``pyproject.toml``).
TESTED_TRL: dict[str, tuple[str, str]] = {
    "async": (">=1.16,<1.17", "it imports trl.experimental.async_grpo's internals (RolloutSample, packing, the trainer "
                              "module), which TRL 1.18 removed when it made AsyncGRPOTrainer stable"),
    "cpu-trainers": (">=1.16,<1.17", "it replaces GRPOTrainer's weight sync to vLLM (trl.generation.vllm_generation "
                                     "internals)"),
    "images": (">=1.16,<1.17", "it overrides GRPOTrainer's internal generation and forward-pass inputs"),
}


def require_tested(path: str, who: str) -> Version:
    """Raise ``VersionError`` unless the installed TRL is one ``path`` (a key of :data:`TESTED_TRL`) is tested with,
    naming the versions and the install command; return the installed version."""
    specifier, reaches = TESTED_TRL[path]
    version = installed_version("trl")
    if version not in SpecifierSet(specifier):
        raise VersionError(
            f"{who} is tested with TRL {show(SpecifierSet(specifier))} only, and TRL {version} is installed: {reaches}. "
            f"Install the tested TRL with pip install 'trl{show(SpecifierSet(specifier))}'; "
            f"GRPOTrainer(rollout_func=ep_trl.create_rollout_func(...)) works with TRL {show(supported_range('trl'))}.")
    return version


@dataclass(frozen=True)
class TrainerView:
    """What one rollout call needs from TRL: the trainer, its ``GRPOConfig`` and its processing class.

    For a rollout worker of ``AsyncGRPOTrainer`` (``ep_trl.rollout_worker``) there is no trainer in reach: the view
    then carries the policy version as its step, the server the trainer pushes its weights to, and where the
    call's metrics go (:meth:`for_rollout_worker`).
    """

    args: Any
    processing_class: Any
    trainer: Any | None
    step: int | None = None
    synced_server_url: str | None = None
    metrics_sink: Callable[[dict[str, float]], None] | None = None

    @classmethod
    def of(cls, trainer: Any) -> "TrainerView":
        return cls(args=trainer.args, processing_class=trainer.processing_class, trainer=trainer)

    @classmethod
    def for_rollout_worker(cls, args: Any, processing_class: Any, model_version: int, server_url: str,
                           metrics_sink: Callable[[dict[str, float]], None]) -> "TrainerView":
        """An ``AsyncGRPOConfig``'s view: sampling and budgets from it, ``model_version`` as the step, generation on
        ``server_url`` (which the trainer keeps on its weights through its weight transfer)."""
        return cls(args=args, processing_class=processing_class, trainer=None, step=model_version,
                   synced_server_url=server_url, metrics_sink=metrics_sink)

    @property
    def tokenizer(self) -> Any:
        """The text tokenizer (a multimodal processor's ``.tokenizer``, else the processing class itself)."""
        return getattr(self.processing_class, "tokenizer", self.processing_class)

    @property
    def num_generations(self) -> int:
        return int(getattr(self.args, "num_generations", None) or 1)

    @property
    def max_completion_length(self) -> int | None:
        value = getattr(self.args, "max_completion_length", None)
        return int(value) if value else None

    @property
    def global_step(self) -> int:
        if self.step is not None:
            return self.step
        state = getattr(self.trainer, "state", None)
        return int(getattr(state, "global_step", 0) or 0)

    @property
    def process_index(self) -> int:
        accelerator = getattr(self.trainer, "accelerator", None)
        return int(getattr(accelerator, "process_index", 0) or 0)

    @property
    def num_processes(self) -> int:
        """Training processes (``accelerate launch``); each calls ``rollout_func`` with its own prompt slice."""
        accelerator = getattr(self.trainer, "accelerator", None)
        return int(getattr(accelerator, "num_processes", 1) or 1)

    def wait_for_weight_sync(self) -> None:
        """With several processes and ``vllm_mode="server"``, wait until every process reached ``rollout_func``.

        TRL pushes new weights to the server from the main process right before calling ``rollout_func`` there;
        the other processes reach their own call without waiting for that push. TRL's built-in generation is
        safe because it gathers all prompts first (a collective); a ``rollout_func`` that generates per process
        must synchronise the same way, or the other processes' first requests hit half-updated weights.
        """
        if self.num_processes <= 1 or self.vllm_mode != "server":
            return
        accelerator = getattr(self.trainer, "accelerator", None)
        if accelerator is None:
            return
        accelerator.wait_for_everyone()

    def model_provider(self) -> Callable[[], Any]:
        """The trainer's model, unwrapped from DDP/accelerate, fetched at each call (it is replaced on resume)."""
        trainer = self.trainer

        def provide() -> Any:
            if trainer is None:  # a rollout worker: the model is the trainer's, in another thread (None here)
                return None
            accelerator = getattr(trainer, "accelerator", None)
            return accelerator.unwrap_model(trainer.model) if accelerator is not None else trainer.model

        return provide

    def sampling(self) -> SamplingParams:
        """TRL's loss assumes samples at the GRPOConfig's temperature (and top-p/top-k/min-p), so use those."""
        a = self.args
        return SamplingParams(
            temperature=float(getattr(a, "temperature", 1.0) or 1.0),
            top_p=float(getattr(a, "top_p", 1.0) or 1.0),
            top_k=int(getattr(a, "top_k", 0) or 0),
            min_p=float(getattr(a, "min_p", None) or 0.0),
            repetition_penalty=float(getattr(a, "repetition_penalty", 1.0) or 1.0),
        )

    @property
    def vllm_mode(self) -> str | None:
        """``"server"`` or ``"colocate"`` when the trainer generates with vLLM (``use_vllm=True``), else None."""
        if not getattr(self.args, "use_vllm", False):
            return None
        return str(getattr(self.args, "vllm_mode", "server"))

    def colocated_engine(self) -> "ColocatedEngine | None":
        """The trainer's own in-process ``vllm.LLM`` (``vllm_mode="colocate"``), with what wakes and sleeps it."""
        if self.vllm_mode != "colocate":
            return None
        args = self.args
        tensor_parallel = int(getattr(args, "vllm_tensor_parallel_size", 1) or 1)
        if tensor_parallel > 1:
            raise ConfigError(
                f"GRPOConfig(vllm_mode='colocate', vllm_tensor_parallel_size={tensor_parallel}): every rank of a "
                "tensor-parallel group must call the engine with the same requests at the same time, and ep_trl's "
                "episodes ask for turns on their own schedule per process, so ep_trl cannot drive a sharded colocated "
                "engine. Use vllm_tensor_parallel_size=1 (one engine per GPU, under accelerate launch too), or "
                "vllm_mode='server' with `trl vllm-serve --tensor-parallel-size N`.")
        generation = getattr(self.trainer, "vllm_generation", None)
        llm = getattr(generation, "llm", None)
        if llm is None:
            raise VersionError("trainer.vllm_generation.llm is missing in this TRL version: ep_trl cannot find the "
                               "colocated engine. Use vllm_mode='server' instead.")
        if not getattr(args, "vllm_enable_sleep_mode", False):
            return ColocatedEngine(llm)
        if not hasattr(generation, "_llm_weights_sleeping"):
            raise VersionError("trainer.vllm_generation has no _llm_weights_sleeping in this TRL version: ep_trl "
                               "cannot tell whether the sleeping engine holds the trainer's weights. Train without "
                               "vllm_enable_sleep_mode, or use vllm_mode='server'.")

        def wake() -> None:
            if generation._llm_weights_sleeping:  # level 2 dropped the weights: push the trainer's again
                generation.sync_weights()
            llm.wake_up(tags=["kv_cache"])

        def sleep() -> None:
            llm.sleep(level=2)
            generation._llm_weights_sleeping = True

        return ColocatedEngine(llm, wake, sleep)

    def vllm_server_url(self) -> str | None:
        """The URL of the trainer's own vLLM server client, when it trains with ``vllm_mode="server"``, or the server
        an ``AsyncGRPOTrainer`` keeps on its weights."""
        if self.synced_server_url is not None:
            return self.synced_server_url
        if self.vllm_mode != "server":
            return None
        client = getattr(getattr(self.trainer, "vllm_generation", None), "vllm_client", None)
        url = getattr(client, "base_url", None)
        if client is not None and url is None:
            raise VersionError(
                "trainer.vllm_generation.vllm_client has no base_url in this TRL version; pass vllm_base_url=... explicitly."
            )
        if url is None:
            base = getattr(self.args, "vllm_server_base_url", None)
            url = base or f"http://{getattr(self.args, 'vllm_server_host', '127.0.0.1')}:{getattr(self.args, 'vllm_server_port', 8000)}"
        return str(url)

    def vllm_server_model(self) -> str | None:
        """The model id the trainer's own vLLM client sends (from the server's ``/v1/models``), if it has one."""
        client = getattr(getattr(self.trainer, "vllm_generation", None), "vllm_client", None)
        model = getattr(client, "model", None)
        return str(model) if model else None

    @property
    def takes_rollout_images(self) -> bool:
        """Whether the trainer puts the ``images`` a rollout returns into its forward passes. TRL 1.16's
        ``GRPOTrainer`` does not (its ``rollout_func`` branch sets ``images = None``); ep_trl's
        ``RolloutImagesGRPOTrainer`` does (``ep_trl.trl_images``, pinned by ``tests/test_trl_images.py``)."""
        from .trl_images import RolloutImagesGRPOTrainer

        return isinstance(self.trainer, RolloutImagesGRPOTrainer)

    def record_metrics(self, metrics: dict[str, float]) -> None:
        """Add ep_trl's per-call numbers to the trainer's logged metrics (``trainer._metrics``), if it has them, or
        hand them to the view's sink."""
        if self.metrics_sink is not None:
            self.metrics_sink(metrics)
            return
        store = getattr(self.trainer, "_metrics", None)
        if not isinstance(store, dict) or "train" not in store:
            return
        for key, value in metrics.items():
            store["train"][key].append(value)


@dataclass(frozen=True)
class ColocatedEngine:
    """TRL's colocated ``vllm.LLM``; with sleep mode, ``wake`` readies it for a rollout call (the trainer's weights
    pushed again if level-2 sleep dropped them, the KV cache back) and ``sleep`` puts it back to sleep after, as TRL's
    own generation does around each ``generate``."""

    llm: Any
    wake: Callable[[], None] | None = None
    sleep: Callable[[], None] | None = None


def view_from_call(args: tuple[Any, ...]) -> TrainerView:
    """The view of ``rollout_func(prompts, trainer)``'s trailing arguments."""
    if len(args) != 1:
        raise TypeError(f"rollout_func expected (prompts, trainer), got {1 + len(args)} arguments; ep_trl supports "
                        "the TRL versions that call it so (pip install -e . pins them)")
    return TrainerView.of(args[0])


def eos_token_ids(processing_class: Any, model: Any | None) -> tuple[int, ...]:
    """End-of-turn ids: the tokenizer's EOS plus the model's generation-config EOS ids."""
    tokenizer = getattr(processing_class, "tokenizer", processing_class)
    ids: list[int] = []
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.append(int(tokenizer.eos_token_id))
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(gen_eos, int):
        ids.append(gen_eos)
    elif gen_eos:
        ids.extend(int(t) for t in gen_eos)
    return tuple(dict.fromkeys(ids))


@contextmanager
def trl_vllm_client_skipped(args: Any) -> Iterator[None]:
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


def attach_vllm_generation(trainer: Any, generation: Any) -> None:
    """Make a ``GRPOTrainer`` built under :func:`trl_vllm_client_skipped` behave as ``use_vllm=True`` in server mode.

    GRPOTrainer 1.16 reads ``use_vllm`` / ``vllm_mode`` off the trainer (not its args) in ``_generate`` (weight
    sync via ``vllm_generation.sync_weights()`` when ``_last_loaded_step`` differs from the global step) and in
    the loss (importance-sampling correction against the ``logprobs`` rollout_func returns). ``generation`` must
    offer ``sync_weights()`` and ``vllm_client.base_url``. ``tests/test_vllm_real.py`` (DiskSyncGRPOTrainer steps
    with TRL's logprob-difference metric) fails when TRL renames or stops reading any of these.
    """
    for name in ("use_vllm", "vllm_mode", "_metrics"):
        if not hasattr(trainer, name):
            raise VersionError(
                f"GRPOTrainer in this TRL version has no attribute {name!r}; ep_trl's server weight sync cannot attach. "
                "Use GRPOConfig(use_vllm=False) with create_openenv_vllm_rollout_func(vllm_base_url=...) instead."
            )
    trainer.use_vllm = True
    trainer.vllm_mode = "server"
    trainer.vllm_generation = generation
    trainer._last_loaded_step = -1  # as GRPOTrainer.__init__ sets it: the first rollout call syncs


def uses_sharded_parameters(trainer: Any) -> bool:
    """Whether the trainer shards parameters across processes (FSDP or DeepSpeed ZeRO-3), so that no single
    process holds the full weights."""
    accelerator = getattr(trainer, "accelerator", None)
    state = getattr(accelerator, "state", None)
    if getattr(state, "fsdp_plugin", None) is not None:
        return True
    deepspeed = getattr(state, "deepspeed_plugin", None)
    return getattr(deepspeed, "zero_stage", 0) == 3
