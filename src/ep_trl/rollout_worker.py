"""``EvalRolloutWorker``: an eval as the rollout worker of TRL's ``AsyncGRPOTrainer``, so rollouts and training steps
overlap instead of waiting for each other.

TRL's ``AsyncGRPOTrainer`` (``trl.experimental.async_grpo``) trains from a queue of ``RolloutSample`` s while a
worker keeps producing them from a vLLM server it keeps on its weights (``max_staleness`` bounds how old a sample
may be). Its own worker scores plain prompts with ``reward_funcs``. This one plays the eval's episodes with
everything the ``rollout_func`` path has, through the same ``RolloutFunction`` (either episode source, the eval's
body, ``ep logs`` rows, failures counted by kind):

* a thread plays rollout calls back to back, each of ``groups_per_call`` prompt groups of ``num_generations``
  episodes (the prompts of ``dataset``, in order, over and over), on the server the trainer syncs;
* each episode becomes one sample: ``input_ids`` = the prompt and completion ids exactly as sampled,
  ``completion_mask`` = 0 over the prompt and ``env_mask`` after it, ``old_log_probs`` = 0 over the prompt and the
  sampled tokens' logprobs after it, ``advantage`` = ``(score - mean) / (std + 1e-8)`` over the group's scored
  episodes (population std, as TRL's own worker computes it); failed or unscored episodes and episodes with no
  sampled token are left out (counted);
* **model versions**: every sample of a call is tagged with the policy version current when the call began, the
  oldest any of its turns can have been sampled with (an episode can span a weight sync: its logprobs are still
  the ones each token was sampled with);
* **staleness and pacing**: a sample already more than ``max_staleness`` versions old when it is ready is dropped
  and counted (``ep_trl/worker/dropped_stale_total``), as the trainer would drop it; the buffer is bounded and the
  worker waits for room before it starts another call, so nothing grows without bound;
* **failure**: an episode's failure costs that episode; an error that ends the worker (a server gone for good,
  calls without a score, a bug) is kept and raised by ``check_health`` in the trainer's thread, as is a worker that
  produced nothing for ``stale_after_s``. ``stop`` cancels the call in flight and closes every session, server
  and thread the worker started.
"""

import logging
import math
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from . import trl_compat
from .dataset import dataset_from_eval
from .errors import ConfigError, RolloutWorkerError
from .generation.vllm import probe_server
from .rollout import RolloutFunction, create_rollout_func

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerCall:
    """One rollout call of the worker: what it played, under which policy versions, how long it took."""

    first_group: int
    episodes: int
    started_version: int
    ended_version: int
    seconds: float
    samples: int
    left_out: int
    dropped_stale: int


class EvalRolloutWorker:
    """TRL's ``RolloutWorkerProtocol`` for an eval: pass it as ``AsyncGRPOTrainer(rollout_worker=...)``::

        args = AsyncGRPOConfig(output_dir="out", vllm_server_base_url="http://127.0.0.1:8000", ...)
        worker = EvalRolloutWorker(env_path, args=args, processing_class=AutoTokenizer.from_pretrained(model))
        trainer = AsyncGRPOTrainer(model=model, args=args, train_dataset=dataset_from_eval(env_path),
                                   rollout_worker=worker)

    Args:
        env_path: the eval, as for ``create_rollout_func``.
        args: the trainer's ``AsyncGRPOConfig``: ``num_generations``, ``temperature``, ``max_completion_length``
            (the episode token budget), ``max_staleness``, ``vllm_server_base_url`` (the server the trainer keeps on
            its weights, where episodes are generated).
        processing_class: the model's tokenizer (or processor), which renders the eval's chat turns.
        dataset: the prompts to play (``dataset_from_eval(env_path)`` by default).
        groups_per_call: prompt groups per rollout call (default: one training step's worth,
            ``per_device_train_batch_size x gradient_accumulation_steps / num_generations``, at least 1).
        buffer_size: most samples waiting for the trainer (default: two calls' worth).
        **options: the keywords of ``create_rollout_func`` (``max_concurrent_rollouts``, ``overrides``, ``vllm``,
            ``options``, ``log_rollouts``, ...).
    """

    def __init__(self, env_path: str, *, args: Any, processing_class: Any, dataset: Any = None,
                 groups_per_call: int | None = None, buffer_size: int | None = None, **options: Any) -> None:
        for name, off in (("top_p", 1.0), ("top_k", 0), ("min_p", 0.0), ("repetition_penalty", 1.0)):
            value = getattr(args, name, None)
            if value is not None and value != off:
                raise ConfigError(f"AsyncGRPOConfig({name}={value!r}): AsyncGRPOTrainer computes the policy's logprobs "
                                  "at the temperature over the whole vocabulary, so samples must come from that "
                                  f"distribution; leave {name} at {off!r}.")
        if "vllm_base_url" in options or "backend" in options:
            raise ConfigError("EvalRolloutWorker generates on AsyncGRPOConfig(vllm_server_base_url=...), the server the "
                              "trainer keeps on its weights; pass no vllm_base_url or backend.")
        self.env_path = env_path
        self._args = args
        self._processing_class = processing_class
        self._num_generations = int(getattr(args, "num_generations", 1) or 1)
        self._max_staleness = int(getattr(args, "max_staleness", 0) or 0)
        self._server_url = str(args.vllm_server_base_url).rstrip("/")
        self._prompts = list((dataset if dataset is not None else dataset_from_eval(env_path))["prompt"])
        if not self._prompts:
            raise ConfigError(f"EvalRolloutWorker({env_path!r}): the dataset has no prompts to play.")
        per_step = int(getattr(args, "per_device_train_batch_size", 1) or 1) * int(
            getattr(args, "gradient_accumulation_steps", 1) or 1)
        self.groups_per_call = groups_per_call or max(1, per_step // self._num_generations)
        self.rollout_buffer: queue.Queue = queue.Queue(
            maxsize=buffer_size or 2 * self.groups_per_call * self._num_generations)
        self.metrics_queue: queue.Queue = queue.Queue()
        probe_server(self._server_url)  # a server that is not there fails now, not when training starts
        self._function: RolloutFunction = create_rollout_func(env_path, backend="vllm", **options)
        self._version = 0
        self._next_group = 0
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._heartbeat = time.monotonic()
        self.calls: list[WorkerCall] = []

    # --- RolloutWorkerProtocol ---------------------------------------------------------------------------------

    def start(self) -> None:
        """Begin producing (the trainer calls it once, after its first weight sync)."""
        if self._thread is not None:
            raise RolloutWorkerError("EvalRolloutWorker.start() was called twice; one worker serves one training run.")
        self._heartbeat = time.monotonic()
        self._thread = threading.Thread(target=self._produce, name="ep-trl-rollout-worker", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Cancel the call in flight, close its sessions, the servers ep_trl started, the loop and the thread."""
        self._stopping.set()
        self._function.close()
        if self._thread is not None:
            self._thread.join(timeout=60)
            if self._thread.is_alive():
                logger.warning("ep_trl's rollout worker thread did not end within 60 s of stop()")

    def update_model_version(self, model_version: int) -> None:
        """The policy version the server now holds (called by the trainer after each weight sync)."""
        self._version = int(model_version)

    def check_health(self, stale_after_s: float) -> None:
        """Raise, in the trainer's thread, what ended the worker, or that it produced nothing for ``stale_after_s``."""
        if self._error is not None:
            raise RolloutWorkerError(f"ep_trl's rollout worker for {self.env_path} stopped: "
                                     f"{type(self._error).__name__}: {self._error}") from self._error
        if self._thread is None or not self._thread.is_alive():
            raise RolloutWorkerError(f"ep_trl's rollout worker for {self.env_path} is not running (start() was not "
                                     "called, or stop() was).")
        quiet = time.monotonic() - self._heartbeat
        if quiet > stale_after_s:
            raise RolloutWorkerError(
                f"ep_trl's rollout worker for {self.env_path} produced nothing for {quiet:.0f} s (more than "
                f"{stale_after_s:g} s): a rollout call of {self.groups_per_call} prompt groups takes longer than that. "
                "Raise AsyncGRPOConfig(heartbeat_stale_after_s=...) or pass a smaller groups_per_call.")

    # --- the producer thread -----------------------------------------------------------------------------------

    def _produce(self) -> None:
        try:
            while not self._stopping.is_set():
                self._play_call()
        except BaseException as exc:  # whatever ended the worker is raised in the trainer's thread by check_health
            if not self._stopping.is_set():
                logger.error("ep_trl's rollout worker stopped: %s: %s", type(exc).__name__, exc)
                self._error = exc

    def _play_call(self) -> None:
        first_group, version = self._next_group, self._version
        prompts = [self._prompts[(first_group + g) % len(self._prompts)] for g in range(self.groups_per_call)
                   for _ in range(self._num_generations)]
        self._next_group += self.groups_per_call
        view = trl_compat.TrainerView.for_rollout_worker(self._args, self._processing_class, version,
                                                         self._server_url, self.metrics_queue.put)
        started = time.monotonic()
        self._heartbeat = started
        out = self._function.run(prompts, view)
        seconds, ended_version = time.monotonic() - started, self._version  # before waiting for room in the buffer
        samples, left_out = episode_samples(out, prompts, self._num_generations, first_group, version,
                                            self._processing_class)
        dropped = 0
        for sample in samples:
            if self._version - sample.model_version > self._max_staleness:
                dropped += 1  # the trainer would drop it too: no room is spent on it
                continue
            if not self._put(sample):
                return
        call = WorkerCall(first_group, len(prompts), version, ended_version, seconds, len(samples) - dropped,
                          left_out, dropped)
        self.calls.append(call)
        self.metrics_queue.put({"ep_trl/worker/samples_total": float(call.samples),
                                "ep_trl/worker/left_out_total": float(left_out),
                                "ep_trl/worker/dropped_stale_total": float(dropped),
                                "ep_trl/worker/call_s": seconds,
                                "ep_trl/worker/version_lag": float(ended_version - version)})

    def _put(self, sample: Any) -> bool:
        """Hand ``sample`` to the trainer, waiting for room (a full buffer is healthy); False when stopping."""
        sample.enqueued_at = time.time()
        while not self._stopping.is_set():
            try:
                self.rollout_buffer.put(sample, timeout=0.5)
            except queue.Full:
                self._heartbeat = time.monotonic()
                continue
            self._heartbeat = time.monotonic()
            return True
        return False


def episode_samples(out: dict[str, list[Any]], prompts: Sequence[Any], num_generations: int, first_group: int,
                    version: int, processing_class: Any) -> tuple[list[Any], int]:
    """One ``RolloutSample`` per episode of a rollout call's output (consecutive blocks of ``num_generations`` are
    one group), and how many episodes were left out (failed, unscored, or without a sampled token)."""
    import numpy as np
    from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

    tokenizer = getattr(processing_class, "tokenizer", processing_class)
    samples, left_out = [], 0
    for g in range(len(prompts) // num_generations):
        members = range(g * num_generations, (g + 1) * num_generations)
        scores = [out["eval_score"][i] for i in members]
        valid = [s for s in scores if s is not None]
        mean = sum(valid) / len(valid) if valid else 0.0
        std = math.sqrt(sum((s - mean) ** 2 for s in valid) / len(valid)) if valid else 0.0
        for i, score in zip(members, scores):
            mask = out["env_mask"][i]
            if score is None or out["episode_status"][i] != "finished" or not any(mask):
                left_out += 1
                continue
            prompt_ids, completion_ids = out["prompt_ids"][i], out["completion_ids"][i]
            samples.append(RolloutSample(
                prompt=list(prompts[i]) if isinstance(prompts[i], list) else [{"role": "user", "content": prompts[i]}],
                completion=[{"role": "assistant", "content": tokenizer.decode(completion_ids)}],
                input_ids=np.asarray(list(prompt_ids) + list(completion_ids), dtype=np.int64),
                completion_mask=np.asarray([0] * len(prompt_ids) + list(mask), dtype=np.int64),
                old_log_probs=np.asarray([0.0] * len(prompt_ids) + list(out["logprobs"][i]), dtype=np.float32),
                advantage=float((score - mean) / (std + 1e-8)),
                model_version=version,
                group_id=first_group + g,
                metrics={"reward": float(score), "reward_std": float(std)},
                enqueued_at=None,
            ))
    return samples, left_out
