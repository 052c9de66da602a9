"""Who calls a rollout, as one rollout call sees it: the trainer's configuration, read once, and what the caller
offers (the step, a server kept on the policy's weights, a colocated engine, the model in this process).

Two callers implement :class:`RolloutCaller`, and a rollout call never asks which it holds:

* ``GRPOTrainer`` calling ``rollout_func(prompts, trainer)``: ``ep_trl.adapters.trl_seam.GRPOTrainerCaller``, the only
  place that reads the trainer's attributes;
* a process that plays episodes for a trainer it cannot reach (the rollout worker of ``AsyncGRPOTrainer``, a shard
  process of ``RolloutOptions(worker_processes=N)``): :class:`DetachedCaller`, which holds the configuration, the
  policy version, the server the trainer keeps on its weights and where the call's metrics go.
"""

import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal, Protocol

from ..errors import ConfigError
from ..generation import SamplingParams, SyncedServer
from ..trajectory.content import tokenizer_of
from ..trajectory.types import Model, ProcessingClass, Tokenizer

if TYPE_CHECKING:  # named for the checker: the engine never imports TRL
    from trl import GRPOTrainer

#: How a TRL trainer generates with vLLM (``GRPOConfig.vllm_mode``): on a server, or in its own process.
VLLMMode = Literal["server", "colocate"]


@dataclass(frozen=True)
class TrainingConfig:
    """A read-only view of the trainer's configuration (a ``GRPOConfig`` or ``AsyncGRPOConfig``) and its processing
    class: what rollouts sample with and how many they are."""

    processing_class: ProcessingClass
    num_generations: int
    max_completion_length: int | None
    sampling: SamplingParams
    #: ``"server"`` or ``"colocate"`` when the trainer generates with vLLM (``use_vllm=True``), else None.
    vllm_mode: VLLMMode | None

    @classmethod
    def of(cls, args: object, processing_class: ProcessingClass) -> "TrainingConfig":
        """Read ``args``. TRL's loss assumes samples at the config's temperature (and top-p/top-k/min-p), so the
        sampling settings are those."""
        max_length = getattr(args, "max_completion_length", None)
        return cls(
            processing_class=processing_class,
            num_generations=int(getattr(args, "num_generations", None) or 1),
            max_completion_length=int(max_length) if max_length else None,
            sampling=SamplingParams(
                temperature=_temperature(args),
                top_p=float(getattr(args, "top_p", 1.0) or 1.0),
                top_k=int(getattr(args, "top_k", 0) or 0),
                min_p=float(getattr(args, "min_p", None) or 0.0),
                repetition_penalty=float(getattr(args, "repetition_penalty", 1.0) or 1.0),
            ),
            vllm_mode=_vllm_mode(args),
        )

    @property
    def tokenizer(self) -> Tokenizer:
        """The text tokenizer (a multimodal processing class's ``.tokenizer``, else the processing class itself)."""
        return tokenizer_of(self.processing_class)


def _vllm_mode(args: object) -> VLLMMode | None:
    """``args.vllm_mode`` when the trainer generates with vLLM (``use_vllm``), else None; a mode TRL does not have is
    refused here, where it is read, rather than taken for "not server" further on."""
    if not getattr(args, "use_vllm", False):
        return None
    mode = str(getattr(args, "vllm_mode", "server"))
    if mode == "server":
        return "server"
    if mode == "colocate":
        return "colocate"
    raise ConfigError(
        f"GRPOConfig(vllm_mode={mode!r}): TRL generates with vLLM on a server (vllm_mode='server') or "
        "in the trainer's process (vllm_mode='colocate'); set one of them."
    )


def _temperature(args: object) -> float:
    """The config's sampling temperature (TRL's default 1.0 when it has none), any real number (a ``numpy.float32``
    from a sweep too) as a float. A non-positive one is refused, as the trainer backend refuses it: GRPO samples its
    completions at this temperature and its loss assumes it."""
    value = getattr(args, "temperature", None)
    if value is None:
        return 1.0
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value <= 0:
        raise ConfigError(
            f"{type(args).__name__}(temperature={value!r}): GRPO samples each completion at the "
            "config's temperature, and its loss assumes it, so it must be a finite number > 0 (TRL's "
            "default is 1.0; for nearly greedy samples use a small one such as 0.1)."
        )
    return float(value)


class RolloutCaller(Protocol):
    """What one rollout call needs from whoever calls it."""

    @property
    def config(self) -> TrainingConfig: ...

    @property
    def step(self) -> int:
        """The trainer's global step, or the policy version a detached caller generates with."""
        ...

    @property
    def process_index(self) -> int: ...

    @property
    def num_processes(self) -> int:
        """Training processes (``accelerate launch``); each calls with its own slice of the step's prompts."""
        ...

    @property
    def model_name(self) -> str | None:
        """The policy's name for ``ep logs`` rows (the trainer's model path), if known."""
        ...

    @property
    def takes_rollout_images(self) -> bool:
        """Whether the caller puts the ``images`` a rollout returns into its forward passes."""
        ...

    @property
    def takes_processed_images(self) -> bool:
        """Whether the caller takes what the processing class made of an episode's images as it rendered them (the
        trajectory's ``processed`` pixel tensors) instead of processing the images again: the chat template then keeps
        them from the episode's renders (``ChatTemplate(keep_pixels=True)``)."""
        ...

    def synced_server(self) -> SyncedServer | None:
        """The vLLM server the caller keeps on the policy's weights, if it has one."""
        ...

    def colocated_trainer(self) -> "GRPOTrainer | None":
        """The trainer whose own vLLM engine generates (``vllm_mode="colocate"``): ``ep_trl.generation.colocate``
        takes the engine from it."""
        ...

    def model_provider(self) -> Callable[[], Model] | None:
        """The policy model in this process, fetched at each call (it is replaced on resume); None when it is not
        in reach."""
        ...

    def record_metrics(self, metrics: dict[str, float]) -> None:
        """Hand ep_trl's per-call numbers to the caller's logged metrics."""
        ...


@dataclass(frozen=True)
class DetachedCaller:
    """A caller without a trainer in reach: a rollout worker's or a shard process's (see the module docstring)."""

    config: TrainingConfig
    step: int
    server: SyncedServer | None
    metrics_sink: Callable[[dict[str, float]], None]
    process_index: int = 0
    num_processes: int = 1
    model_name: str | None = None
    takes_rollout_images: bool = False
    takes_processed_images: bool = False

    def synced_server(self) -> SyncedServer | None:
        return self.server

    def colocated_trainer(self) -> None:
        return None

    def model_provider(self) -> None:
        return None

    def record_metrics(self, metrics: dict[str, float]) -> None:
        self.metrics_sink(metrics)


class GreedyCaller:
    """Another caller (a trainer's) with greedy sampling (temperature 0) and one episode per prompt: ``ep-trl train
    --held-out`` plays its held-out episodes through the rollout path with the trainer's processing class, model (or
    the vLLM server kept on its weights) and episode budget, and hands no metrics to the trainer's log."""

    def __init__(self, caller: RolloutCaller) -> None:
        self._caller = caller
        self.config = replace(caller.config, num_generations=1, sampling=SamplingParams(temperature=0.0))

    @property
    def step(self) -> int:
        return self._caller.step

    @property
    def process_index(self) -> int:
        return self._caller.process_index

    @property
    def num_processes(self) -> int:
        return self._caller.num_processes

    @property
    def model_name(self) -> str | None:
        return self._caller.model_name

    @property
    def takes_rollout_images(self) -> bool:
        return self._caller.takes_rollout_images

    @property
    def takes_processed_images(self) -> bool:
        return self._caller.takes_processed_images

    def synced_server(self) -> "SyncedServer | None":
        return self._caller.synced_server()

    def colocated_trainer(self) -> "GRPOTrainer | None":
        return self._caller.colocated_trainer()

    def model_provider(self) -> Callable[[], Model] | None:
        return self._caller.model_provider()

    def record_metrics(self, metrics: dict[str, float]) -> None:
        return None  # held-out play is not a training step: nothing of it goes into the trainer's log


class GroupNumbers:
    """Run-wide prompt group numbers (task rotation, ``ep logs``) as one process counts them: ``first(caller, n)`` is
    the number of a call's first of ``n`` groups, counted across calls and, under ``accelerate launch``, across
    processes (each process gets its own slice of the step's groups)."""

    def __init__(self) -> None:
        self._started = 0

    def first(self, caller: RolloutCaller, groups: int) -> int:
        first = self._started * caller.num_processes + caller.process_index * groups
        self._started += groups
        return first
