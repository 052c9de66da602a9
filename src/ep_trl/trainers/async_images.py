"""TRL's ``AsyncGRPOTrainer`` with the pixels of each sample in its forward passes: a vision-language model trained
asynchronously on an eval's screenshots.

TRL 1.16's ``AsyncGRPOTrainer`` loads a vision-language checkpoint but trains it on token ids alone: its
``RolloutSample`` carries no images, its packer (``DataCollatorForRollout`` over ``packing.TreeRow``) lays samples
out as ids, and ``compute_loss`` calls the model with ids, positions and the tree-attention layout only; the vision
tower is frozen. With ``ep_trl.EvalRolloutWorker`` on a vision-language processing class, each sample's ``input_ids``
carry its episode's images (``ep_trl.trajectory.sample_images.ImageIds``; the ids already hold every image's expanded
tokens, as in the synchronous path). :class:`AsyncImagesGRPOTrainer` puts them into every forward pass, extending three
places of TRL's trainer and calling TRL's own code in each:

* **packing**: TRL's tree packing shares a prefix between samples by token ids alone, and two episodes of a group
  whose screenshots differ have the same image tokens: sharing them would show one sample the other's pixels. Rows
  that hold an image sample are therefore packed **unshared**: each sample is its own chain (``UnsharedTreeRow``,
  a ``TreeRow`` whose samples never meet in the trie), which is TRL's padding-free packing without prefix sharing. The
  collator (``ImagesRolloutCollator``, a ``DataCollatorForRollout``) then adds the row's vision inputs: the pixel
  tensors each sample carries (its images processed once, by the worker: ``ep_trl.trajectory.sample_images``), joined in
  row order (``ep_trl.trajectory.vision_inputs``); a sample that carries its images unprocessed (a custom worker's) is
  processed here, once. Text-only rows are packed as TRL packs them. Because the unshared rows forward every token,
  batches are planned by sample count: ``token_budget=0``;
* **the forward**: ``compute_loss`` is TRL's; the vision inputs reach the model through a forward pre-hook held for
  that call, so the loss, the importance ratio (``ratio``), ``kl``, entropy and clipping metrics are all computed
  with the pixels. ``AsyncGRPOTrainer`` does not recompute old logprobs (it uses the sampled ones), so there is no
  other forward. A forward hook reads the same pass's logprobs for ``sampling/sampling_logp_difference/{mean,max}``
  (|trainer − sampled| over the trained tokens, the metric ``GRPOTrainer`` logs with vLLM; ``AsyncGRPOTrainer`` logs
  none);
* **the vision tower** trains too (``train_vision=True``, as ``GRPOTrainer`` trains every weight): TRL freezes all
  but the text model, and its weight sync sends only trainable parameters, so the vision weights reach the server
  with each sync (for TRL's NCCL transfer the manifest is rebuilt over the trainable parameters). Its attention runs
  on ``sdpa`` (TRL loads every sub-model with its tree attention, which only the text model's packed rows need).

Refused at construction, each naming the fix: a processing class without images, no ``rollout_worker`` (TRL's own
worker renders no images), a model that cannot take them (text-only, or whose image token is not the processing
class's), models whose positions depend on the images (M-RoPE, as Qwen-VL: the packed rows carry 1-D positions),
``token_budget`` other than 0, several training processes (the vision inputs of a micro-batch are built for one), and
a TRL this is not tested with. ``CPUAsyncImagesGRPOTrainer`` is the CPU stand-in (``ep_trl.trainers.cpu_async``), for
development and CI against the CPU vLLM server.

This is the one module that knows the TRL internals of the image path: ``DataCollatorForRollout`` (built by
``get_train_dataloader`` under that module-level name, and called with one micro-batch of ``TreeRow`` s), ``TreeRow``'s
``roots`` and ``add``, the batch keys ``compute_loss`` reads, ``_is_vlm``, ``_iter_vllm_named_params`` and
``WeightTransferClient``'s constructor. ``tests/trainers/test_async_images.py`` pins them.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING, Any, Protocol, cast

from ..adapters import trl_seam
from ..errors import ConfigError, VersionError
from ..trajectory.content import supports_images
from ..trajectory.sample_images import config_image_token, image_token_id, images_of, processed_images_of
from ..trajectory.vision_inputs import joined_vision_inputs

trl_seam.require_tested("async", "ep_trl.trainers.async_images")  # before TRL's experimental modules are imported

import trl.experimental.async_grpo.async_grpo_trainer as trainer_module  # noqa: E402  (the version is checked first)
from transformers import PreTrainedModel  # noqa: E402
from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer  # noqa: E402
from trl.experimental.async_grpo.packing import TreeRow  # noqa: E402

from .cpu_async import CPUAsyncGRPOTrainer  # noqa: E402

if TYPE_CHECKING:
    import torch
    from torch.utils.data import DataLoader
    from trl.experimental.async_grpo.async_grpo_trainer import RewardFunc

    from ..trajectory.types import MultimodalProcessingClass

#: Where the vision inputs travel in a collated batch (each with a leading axis of one row per process).
VISION_PREFIX = "ep_trl_vision/"


class UnsharedTreeRow(TreeRow):
    """A ``TreeRow`` whose samples share no token: each is its own chain of the trie, laid out whole and in the order
    added (TRL's packing without prefix sharing), so a sample's image tokens see only its own pixels."""

    def add(self, sample: dict[str, object]) -> None:
        shared, self.roots = self.roots, {}
        try:
            super().add(sample)
        finally:
            own, self.roots = self.roots, shared
        # one sample, one root: keyed on a negative token, which no sample holds, so nothing ever extends it
        for node in own.values():
            shared[(-len(self.samples), None)] = node


@dataclasses.dataclass
class ImagesRolloutCollator(trainer_module.DataCollatorForRollout):
    """TRL's collator; rows holding an image sample are repacked unshared, and the batch gains each row's vision
    inputs under ``VISION_PREFIX``."""

    processing_class: MultimodalProcessingClass | None = None

    def torch_call(self, examples: list[list[TreeRow]]) -> dict[str, torch.Tensor]:
        (rows,) = examples
        if not any(images_of(sample["input_ids"]) for row in rows for sample in row.samples):
            return super().torch_call(examples)
        if len(rows) != 1:
            raise ConfigError("AsyncImagesGRPOTrainer builds the vision inputs of a micro-batch for one process.")
        rows = [_unshared(rows[0])]
        batch = super().torch_call([rows])
        ids = batch["input_ids"][0][batch["attention_mask"][0].bool()]
        carried = [sample["input_ids"] for sample in rows[0].samples if images_of(sample["input_ids"])]
        processed = [processed_images_of(self.processing_class, sample_ids) for sample_ids in carried]  # in row order
        expected = sum(p.image_tokens for p in processed)
        held = int((ids == image_token_id(self.processing_class)).sum())
        if held != expected:  # the worker leaves such episodes out; a sample from elsewhere must not reach the model
            raise ValueError(
                f"A packed row holds {held} image tokens and its samples' images expand into {expected}: "
                "a sample's images do not match its image tokens (EvalRolloutWorker leaves such "
                "episodes out; a custom worker must too)."
            )
        vision = joined_vision_inputs(
            self.processing_class,
            ids.unsqueeze(0),
            [p.pixels for p in processed],
            sum(len(images_of(sample_ids)) for sample_ids in carried),
        )
        for key, value in vision.model_kwargs.items():
            batch[VISION_PREFIX + key] = value.unsqueeze(0)
        return batch


def _unshared(row: TreeRow) -> UnsharedTreeRow:
    unshared = UnsharedTreeRow()
    for sample in row.samples:
        unshared.add(sample)
    return unshared


class AsyncImagesGRPOTrainer(AsyncGRPOTrainer):
    """``AsyncGRPOTrainer`` whose forward passes see each sample's images (see the module docstring).

    Args:
        model: the vision-language model (a path or hub id, as for ``AsyncGRPOTrainer``).
        reward_funcs, args: as for ``AsyncGRPOTrainer`` (``args.token_budget`` must be 0).
        processing_class: the model's multimodal processing class (the one the rollout worker renders with).
        train_vision: whether the vision tower and its connector train too (default True, as in ``GRPOTrainer``;
            TRL's async trainer freezes them).
        **kwargs: the rest of ``AsyncGRPOTrainer``'s arguments: ``rollout_worker`` is required (an
            ``ep_trl.EvalRolloutWorker`` on the same processing class), ``weight_transfer``, ...
    """

    #: Samples' images reach the forward passes (``EvalRolloutWorker.take_images``).
    takes_rollout_images = True
    args: AsyncGRPOConfig

    def __init__(
        self,
        model: str,
        reward_funcs: RewardFunc | list[RewardFunc] | None = None,
        args: AsyncGRPOConfig | None = None,
        *,
        processing_class: MultimodalProcessingClass,
        train_vision: bool = True,
        **kwargs: Any,
    ) -> None:
        trl_seam.require_tested("async", type(self).__name__)
        name = type(self).__name__
        if not supports_images(processing_class):
            raise ConfigError(
                f"{name}(processing_class={type(processing_class).__name__}): a text tokenizer renders "
                "no images. Pass the vision-language model's processing class (AutoProcessor.from_pretrained("
                "model)), or train a text model with AsyncGRPOTrainer."
            )
        if args is None or getattr(args, "token_budget", None) != 0:
            raise ConfigError(
                f"{name} packs rows that hold images without prefix sharing and plans micro-batches by "
                "sample count: pass AsyncGRPOConfig(token_budget=0) and size "
                "per_device_train_batch_size to the memory you have."
            )
        worker = kwargs.get("rollout_worker")
        if worker is None:
            raise ConfigError(
                f"{name} needs rollout_worker=: without one, AsyncGRPOTrainer builds its own worker, "
                "which renders text prompts only, so the model would be trained without a pixel. Pass "
                "rollout_worker=EvalRolloutWorker(env_path, args=args, processing_class=processing_class) "
                "built with this model's processing class (AutoProcessor)."
            )
        if getattr(worker, "renders_images", None) is False:
            raise ConfigError(
                f"{name}: the rollout worker renders no images (its processing class is a text "
                "tokenizer), so the model would never see a pixel. Pass the same processing class to "
                "EvalRolloutWorker(processing_class=...)."
            )
        if hasattr(worker, "take_images"):
            worker.take_images(name)  # before TRL reads its rollout_buffer
        super().__init__(model, reward_funcs, args, processing_class=processing_class.tokenizer, **kwargs)
        self.vision_processing_class = processing_class
        self._image_token = image_token_id(processing_class)
        self._check_model(name)
        if self.accelerator.num_processes != 1:
            raise ConfigError(
                f"{name} trains in one process ({self.accelerator.num_processes} were launched): the "
                "vision inputs of a micro-batch are built for one row. Launch one training process."
            )
        self._policy.set_attn_implementation({"vision_config": "sdpa"})
        if train_vision and not hasattr(self.model, "peft_config"):
            self._policy.requires_grad_(True)
            self._rebuild_weight_manifest(kwargs.get("weight_transfer"))

    @property
    def _policy(self) -> PreTrainedModel:
        """The model being trained: a ``PreTrainedModel``, or a peft model, which forwards its attributes to one."""
        return cast(PreTrainedModel, self.model)

    def _check_model(self, name: str) -> None:
        model = self.accelerator.unwrap_model(self.model)
        if not self._is_vlm:
            raise ConfigError(
                f"{name}: {type(model).__name__} is a text-only model, so it cannot take the images "
                f"{type(self.vision_processing_class).__name__} renders. Pass a vision-language model with its own "
                "processing class, or train the text model with AsyncGRPOTrainer and the processing class's "
                "tokenizer (processing_class.tokenizer) in the worker."
            )
        model_token = config_image_token(model.config)
        processing_class_token = image_token_id(self.vision_processing_class)
        if model_token is not None and int(model_token) != processing_class_token:
            raise ConfigError(
                f"{name}: {type(self.vision_processing_class).__name__}'s image token is id {processing_class_token}, "
                "and "
                f"{type(model).__name__} puts its image features at id {model_token}: the processing class is "
                "not this model's. Pass AutoProcessor.from_pretrained(model) (to the worker too)."
            )
        if any(hasattr(module, "get_rope_index") for module in model.modules()):
            raise ConfigError(
                f"{name}: {type(model).__name__} computes its positions from the images (M-RoPE), and "
                "AsyncGRPOTrainer's packed rows carry 1-D positions. Train it with GRPOTrainer and "
                "ep_trl.trainers.images.RolloutImagesGRPOTrainer."
            )

    def _rebuild_weight_manifest(self, injected: object) -> None:
        """TRL's NCCL ``WeightTransferClient`` sizes the server's buffers from a manifest of the trainable parameters
        taken in the constructor, before the vision tower was unfrozen: build it again over what is sent now."""
        if injected is not None or self.weight_transfer is None or self.vllm_client is None or self._lora_sync:
            return
        names, dtypes, shapes = [], [], []
        for param_name, param in trainer_module._iter_vllm_named_params(self._policy):
            names.append(param_name)
            dtypes.append(str(param.dtype).split(".")[-1])
            shapes.append(list(param.shape))
        self.weight_transfer = trainer_module.WeightTransferClient(
            vllm_client=self.vllm_client,
            weight_update_info={"names": names, "dtype_names": dtypes, "shapes": shapes},
            weight_sync_timeout=self.args.weight_sync_timeout,
        )

    def get_train_dataloader(self) -> DataLoader:
        collator = trainer_module.DataCollatorForRollout
        # only while TRL builds its data loader
        setattr(
            trainer_module,
            "DataCollatorForRollout",
            functools.partial(ImagesRolloutCollator, processing_class=self.vision_processing_class),
        )
        try:
            return super().get_train_dataloader()
        finally:
            setattr(trainer_module, "DataCollatorForRollout", collator)

    def compute_loss(
        self,
        model: torch.nn.Module,
        inputs: dict[str, torch.Tensor],
        return_outputs: bool = False,
        num_items_in_batch: torch.Tensor | int | None = None,
    ) -> torch.Tensor:
        vision = {
            key[len(VISION_PREFIX) :]: inputs.pop(key)[0] for key in list(inputs) if key.startswith(VISION_PREFIX)
        }
        if not vision and bool((inputs["input_ids"] == self._image_token).any()):
            raise VersionError(
                "A packed batch holds image tokens and no vision inputs: TRL's data loader did not "
                "build its batches with ep_trl's collator (ImagesRolloutCollator), so this TRL builds "
                "them another way than the one AsyncImagesGRPOTrainer is tested with."
            )
        forward: dict[str, torch.Tensor] = {}

        def add_pixels(
            module: torch.nn.Module, args: tuple[object, ...], kwargs: dict[str, object]
        ) -> tuple[tuple[object, ...], dict[str, object]]:
            return args, {**kwargs, **vision}

        def keep_log_probs(
            module: torch.nn.Module, args: tuple[object, ...], kwargs: dict[str, object], output: _LogProbsOutput
        ) -> None:
            forward["log_probs"] = output.log_probs.detach()

        hooks = [model.register_forward_hook(keep_log_probs, with_kwargs=True)]
        if vision:
            hooks.append(model.register_forward_pre_hook(add_pixels, with_kwargs=True))
        try:
            loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        finally:
            for hook in hooks:
                hook.remove()
        selected = inputs["token_index"] >= 0
        trained = forward["log_probs"].flatten()[inputs["token_index"][selected]]
        difference = (trained - inputs["old_log_probs"][selected]).abs()
        if difference.numel():
            self._metrics["train"]["sampling/sampling_logp_difference/mean"].append(difference.mean().item())
            self._metrics["train"]["sampling/sampling_logp_difference/max"].append(difference.max().item())
        return loss


class _LogProbsOutput(Protocol):
    """What the policy's forward returns under TRL's async trainer: the packed tokens' log-probabilities."""

    log_probs: torch.Tensor


class CPUAsyncImagesGRPOTrainer(AsyncImagesGRPOTrainer, CPUAsyncGRPOTrainer):
    """:class:`AsyncImagesGRPOTrainer` on CPU (``AsyncGRPOConfig(use_cpu=True, bf16=False, token_budget=0)``): the
    image seam of this module over ``ep_trl.trainers.cpu_async.CPUAsyncGRPOTrainer``'s CPU stand-ins."""
