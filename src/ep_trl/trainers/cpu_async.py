"""TRL's ``AsyncGRPOTrainer`` on CPU: the two places where TRL 1.16's experimental async trainer assumes CUDA.

* ``AsyncGRPOTrainer.__init__`` always asks for the device's peak FLOPs (for its MFU metrics) through
  ``torch.cuda.get_device_name``, which raises on a CPU build of torch. :class:`CPUAsyncGRPOTrainer` answers "unknown
  device" (``None``: TRL then skips the MFU metrics) while its constructor runs, and nowhere else.
* The trainer loads the model with ``attn_implementation="tree_fa3"``: packed, prefix-shared rows attended by a
  FlashAttention-3 kernel fetched from the hub (CUDA only). :func:`tree_attention` is the same contract in plain
  torch, one ``scaled_dot_product_attention`` per packed segment, registered under that name in transformers'
  public ``AttentionInterface`` after construction (the constructor registers TRL's own first).

Everything else (packing, the loss, staleness, the weight-sync cadence) is TRL's own. Use it for development and CI;
on GPUs use ``AsyncGRPOTrainer`` itself. ``tests/adapters/test_async_worker.py`` trains with it against the installed
TRL, which pins both workarounds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from ..adapters import trl_seam
from ..errors import ConfigError

trl_seam.require_tested("async", "ep_trl.trainers.cpu_async")  # before TRL's experimental module is imported

from trl.experimental.async_grpo import AsyncGRPOTrainer  # noqa: E402  (the version is checked first)

if TYPE_CHECKING:
    from trl.experimental.async_grpo import AsyncGRPOConfig
    from trl.experimental.async_grpo.async_grpo_trainer import RewardFunc


class CPUAsyncGRPOTrainer(AsyncGRPOTrainer):
    """``AsyncGRPOTrainer`` that runs on CPU (``AsyncGRPOConfig(use_cpu=True, bf16=False)``); see the module
    docstring for exactly what differs."""

    def __init__(
        self,
        model: str,
        reward_funcs: RewardFunc | list[RewardFunc] | None = None,
        args: AsyncGRPOConfig | None = None,
        **kwargs: Any,
    ) -> None:
        config = args
        if config is None or not getattr(config, "use_cpu", False):
            raise ConfigError(
                "CPUAsyncGRPOTrainer needs AsyncGRPOConfig(use_cpu=True, bf16=False): it is the CPU "
                "stand-in for AsyncGRPOTrainer (on GPUs use AsyncGRPOTrainer itself)."
            )
        if getattr(config, "bf16", False):
            raise ConfigError(
                "AsyncGRPOConfig(bf16=True) on CPU trains in bfloat16 autocast while the CPU vLLM server "
                "samples in float32: the importance ratio would compare different precisions. Pass "
                "bf16=False."
            )
        import trl.experimental.async_grpo.async_grpo_trainer as trainer_module

        peak_flops = trainer_module.get_peak_flops_per_device
        trainer_module.get_peak_flops_per_device = _unknown_device  # only while the constructor runs
        try:
            super().__init__(model, reward_funcs, args, **kwargs)
        finally:
            trainer_module.get_peak_flops_per_device = peak_flops
        from transformers import AttentionInterface
        from trl.experimental.async_grpo.packing import TREE_ATTENTION

        AttentionInterface.register(TREE_ATTENTION, tree_attention)


def _unknown_device(accelerator: object, dtype: object) -> None:
    """What ``get_peak_flops_per_device`` answers for a device it does not know: no MFU metrics."""
    return None


def tree_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    *,
    tree_kv_index: torch.Tensor,
    tree_cu_seqlens_q: torch.Tensor,
    tree_cu_seqlens_k: torch.Tensor,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    **_: object,
) -> tuple[torch.Tensor, None]:
    """TRL's packed tree attention in plain torch. ``query``/``key``/``value`` are ``(1, heads, N, dim)`` over the N
    packed tokens; segment ``s`` attends its queries ``cu_q[s]:cu_q[s+1]`` to the keys
    ``tree_kv_index[cu_k[s]:cu_k[s+1]]`` (its path from the root, itself last), causally aligned to the end, as
    flash-attention's variable-length kernel does. Returns ``(1, N, heads, dim)``."""
    if softcap:
        raise NotImplementedError("the CPU tree attention does not implement softcap")
    q = query.transpose(1, 2)[0]
    k = key.transpose(1, 2)[0].index_select(0, tree_kv_index)
    v = value.transpose(1, 2)[0].index_select(0, tree_kv_index)
    if k.shape[1] != q.shape[1]:  # grouped-query attention: each key head serves several query heads
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    out = torch.empty_like(q)
    cu_q, cu_k = tree_cu_seqlens_q.tolist(), tree_cu_seqlens_k.tolist()
    for s in range(len(cu_q) - 1):
        (q0, q1), (k0, k1) = cu_q[s : s + 2], cu_k[s : s + 2]
        rows = torch.arange(q1 - q0).unsqueeze(1)
        cols = torch.arange(k1 - k0).unsqueeze(0)
        offset = (k1 - k0) - (q1 - q0)
        allowed = cols <= rows + offset
        if sliding_window:
            allowed &= cols > rows + offset - sliding_window
        attended = torch.nn.functional.scaled_dot_product_attention(
            q[q0:q1].transpose(0, 1),
            k[k0:k1].transpose(0, 1),
            v[k0:k1].transpose(0, 1),
            attn_mask=allowed,
            scale=scaling,
        )
        out[q0:q1] = attended.transpose(0, 1)
    return out.unsqueeze(0), None
