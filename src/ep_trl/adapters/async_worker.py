"""``EvalRolloutWorker``: an eval as the rollout worker of TRL's ``AsyncGRPOTrainer``, so rollouts and training steps
overlap instead of waiting for each other (docs/async.md, "What the worker does", says it all with the reasons).

TRL's own worker scores plain prompts with ``reward_funcs``; this one plays the eval's episodes with everything the
``rollout_func`` path has (either episode source, the eval's body, ``ep logs`` rows, failures counted by kind), from
the same stream (``ep_trl.engine.stream``):

* **continuous slots**: ``max_concurrent_rollouts`` episodes stay in flight on the server the trainer syncs (the
  dataset's prompts over and over, ``num_generations`` per group); a group is released the moment it is complete and
  scored, whatever another group's straggler takes;
* **samples**: the ids exactly as sampled, ``env_mask`` over inserted tokens, the sampled logprobs, the group's
  advantages (:mod:`ep_trl.adapters.samples`); failed or unscored episodes are left out, counted;
* **versions**: a sample is tagged with the oldest policy version its turns were sent under (never too new); one more
  than ``max_staleness`` behind when it would enter the buffer is dropped, counted; with ``--enable-lora`` each turn is
  generated with its version's adapter (:mod:`ep_trl.adapters.policy_adapters`);
* **images**: with a vision-language processing class each sample carries its episode's images and pixel tensors,
  made in a thread off the event loop; only ``AsyncImagesGRPOTrainer`` takes such a worker; ``max_buffered_images``
  bounds what :meth:`EvalRolloutWorker.bounded_images` counts;
* **failure and SIGTERM**: an episode's failure costs that episode; what ends the worker is raised by
  ``check_health`` in the trainer's thread, and after a SIGTERM the trainer's next call into the worker raises
  ``Terminated``. ``stop`` cancels the episodes in flight and closes what the worker started.
"""

import asyncio
import functools
import itertools
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import aclosing
from multiprocessing.queues import Queue as MPQueue
from typing import TYPE_CHECKING, Any

from .. import evalprotocol
from ..dataset import dataset_from_eval
from ..engine.caller import DetachedCaller, TrainingConfig
from ..engine.engine import build_engine
from ..engine.metrics import summary_line
from ..engine.stream import GroupPlan, ScoredGroup, SlotMeter
from ..errors import ConfigError, RolloutWorkerError
from ..generation import SyncedServer
from ..generation.probe import probe_server
from ..runtime import shutdown
from ..runtime.threads import run_blocking
from ..trajectory.content import supports_images
from ..trajectory.types import ProcessingClass
from . import trl_seam
from .policy_adapters import PolicyAdapters
from .samples import GroupSamples, SampleBuffer, group_samples, images_in
from .worker_checks import check_arguments, check_served_model_takes_images, episode_images
from .worker_records import ReleaseRecord, Reported, put_dropping_oldest, window_metrics

if TYPE_CHECKING:  # named for the checker: TRL's async trainer is imported only where the worker is built
    from trl.experimental.async_grpo import AsyncGRPOConfig
    from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

logger = logging.getLogger(__name__)

#: How often the worker looks again at a full buffer (the loop keeps playing meanwhile).
BUFFER_POLL_S = 0.02
#: Metric dicts kept for the trainer; past this, the oldest are dropped (counted in ``metrics_dropped``).
METRICS_QUEUE_SIZE = 256
#: Released groups ``EvalRolloutWorker.groups`` remembers (the most recent).
GROUP_RECORDS = 10_000
#: Longest a released group's samples may take to make (its images processed, in a thread) before the worker stops.
SAMPLES_TIMEOUT_S = 600.0


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
        processing_class: the model's tokenizer, which renders the eval's chat turns; or a vision-language model's
            processing class, which renders the eval's images too (each sample then carries its episode's images, and
            only ``ep_trl.trainers.async_images.AsyncImagesGRPOTrainer`` trains on such a worker).
        dataset: the prompts to play (``dataset_from_eval(env_path)`` by default).
        buffer_size: most samples waiting for the trainer (default: two training steps' worth, at least the
            episode slots).
        max_buffered_images: most images the worker holds at once, each its decoded image with the pixel tensors
            the processing class made of it (default: no bound beyond ``buffer_size``): those of the samples in the
            buffer and of those released, waiting for room, plus ``max_episode_images`` reserved for each episode
            started and not yet released (playing, or ended in a group still playing). An episode starts only if its
            reservation fits, so the bound holds at all times; it must be at least ``num_generations *
            max_episode_images`` (a group is released whole), and ``slots * max_episode_images`` keeps every slot
            busy. Not counted (:meth:`bounded_images`): the samples the trainer took, passing copies while an image is
            decoded or processed, and the image sources (data URIs) in messages and log rows.
        max_episode_images: the most images one episode may hold, what ``max_buffered_images`` reserves per
            episode; a turn that would pass it is not sent and stops the worker (``ConfigError``). Default, with
            ``max_buffered_images`` on an OpenEnv eval: its prompt's images plus one per environment step (the
            eval's ``steps``: a screenshot per observation); a processor eval (whose turns its processor decides)
            must pass it.
        **options: the keywords of ``create_rollout_func`` (``max_concurrent_rollouts``: the episode slots,
            ``overrides``, ``vllm``, ``options``, ``log_rollouts``, ...).
    """

    def __init__(
        self,
        env_path: str,
        *,
        args: "AsyncGRPOConfig",
        processing_class: ProcessingClass,
        dataset: Any = None,
        buffer_size: int | None = None,
        max_buffered_images: int | None = None,
        max_episode_images: int | None = None,
        **options: Any,
    ) -> None:
        trl_seam.require_tested("async", "EvalRolloutWorker")
        check_arguments(args, processing_class, options, max_buffered_images, max_episode_images)
        self.env_path = env_path
        #: Whether episodes render images (a vision-language model's processing class): samples then carry them.
        self.renders_images = supports_images(processing_class)
        self.max_buffered_images = max_buffered_images
        self._images_taken_by: str | None = None
        self._config = TrainingConfig.of(args, processing_class)
        self._max_staleness = int(getattr(args, "max_staleness", 0) or 0)
        self._server_url = str(args.vllm_server_base_url).rstrip("/")
        self._prompts = list((dataset if dataset is not None else dataset_from_eval(env_path))["prompt"])
        if not self._prompts:
            raise ConfigError(f"EvalRolloutWorker({env_path!r}): the dataset has no prompts to play.")
        served = probe_server(self._server_url)  # a server that is not there fails now, not when training starts
        if self.renders_images:
            check_served_model_takes_images(self._server_url, served.model, processing_class)
        #: The LoRA adapters the server serves for this run's policy versions (when the trainer syncs adapters).
        self.adapters = PolicyAdapters(self._server_url, served.model)
        #: What plays the episodes (``ep_trl.engine.engine``), used through its public methods only.
        self.engine = build_engine(env_path, backend="vllm", **options)
        try:
            self.engine.check(self._prompts)  # a prompt it cannot play fails now, not mid-training
            #: The images reserved per episode in flight (None: episodes' images are not bounded).
            self.max_episode_images = episode_images(
                self.engine.spec, self._prompts, self._config.num_generations, max_buffered_images, max_episode_images
            )
        except BaseException:
            self.engine.close()  # the servers ep_trl may have started for the eval
            raise
        #: Episodes in flight at once (the eval's ``max_concurrent_rollouts``, or the keyword's).
        self.slots = self.engine.spec.max_concurrent_rollouts
        per_step = int(getattr(args, "per_device_train_batch_size", 1) or 1) * int(
            getattr(args, "gradient_accumulation_steps", 1) or 1
        )
        #: Groups per report of the ``ep_trl/*`` metrics (one training step's worth).
        self.groups_per_report = max(1, per_step // self._config.num_generations)
        self._buffer: queue.Queue = SampleBuffer(maxsize=buffer_size or max(2 * per_step, self.slots))
        self.metrics_queue: queue.Queue | MPQueue = queue.Queue(maxsize=METRICS_QUEUE_SIZE)
        self.metrics_dropped = 0
        self.meter = SlotMeter()
        self._version = 0
        self._pending: "deque[RolloutSample]" = deque()  # released samples waiting for room in the buffer
        self._released_episodes = 0  # episodes of released groups (the rest of meter.episodes is in flight)
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._heartbeat = time.monotonic()
        self._started_at: float | None = None
        #: The most recent released groups (``GROUP_RECORDS``), oldest first.
        self.groups: deque[ReleaseRecord] = deque(maxlen=GROUP_RECORDS)
        self.left_out = 0
        #: Episodes left out because their images did not match their image tokens (part of ``left_out``).
        self.image_mismatches = 0
        self.samples_put = 0
        self.dropped_stale = 0
        self._reported: dict[str, int] = {}

    # --- RolloutWorkerProtocol ---------------------------------------------------------------------------------

    @property
    def rollout_buffer(self) -> queue.Queue | MPQueue:
        """The samples for the trainer (TRL's ``RolloutWorkerProtocol``). A worker that renders images serves only a
        trainer that took them (:meth:`take_images`): any other would train on image tokens without their pixels."""
        if self.renders_images and self._images_taken_by is None:
            raise ConfigError(
                f"EvalRolloutWorker({self.env_path!r}) renders images into its samples "
                f"({type(self._config.processing_class).__name__}), and this trainer would leave them out of its "
                "forward passes: the model would be trained on image tokens without their pixels. Train with "
                "ep_trl.trainers.async_images.AsyncImagesGRPOTrainer (CPUAsyncImagesGRPOTrainer on CPU) in place of "
                "AsyncGRPOTrainer, or pass the text tokenizer (processing_class.tokenizer) to the worker (images are "
                "then dropped from the prompts)."
            )
        return self._buffer

    @rollout_buffer.setter
    def rollout_buffer(self, buffer: queue.Queue | MPQueue) -> None:
        if not isinstance(buffer, queue.Queue):
            raise ConfigError(
                f"EvalRolloutWorker.rollout_buffer = {type(buffer).__name__}: the worker runs in the "
                "trainer's process and needs a queue.Queue (it trims the queue in place)"
            )
        self._buffer = buffer

    def take_images(self, trainer: str) -> None:
        """Called by a trainer that puts each sample's images into its forward passes (``trainer`` names it), before
        it reads ``rollout_buffer``."""
        self._images_taken_by = trainer

    def start(self) -> None:
        """Begin producing (the trainer calls it once, after its first weight sync)."""
        if self._thread is not None:
            raise RolloutWorkerError("EvalRolloutWorker.start() was called twice; one worker serves one training run.")
        self._heartbeat = self._started_at = time.monotonic()
        self.meter = SlotMeter()
        self._thread = threading.Thread(target=self._produce, name="ep-trl-rollout-worker", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Cancel the episodes in flight, close their sessions, the servers ep_trl started, the loop and the thread."""
        self._stopping.set()
        self.engine.close()
        if self._thread is not None:
            self._thread.join(timeout=60)
            if self._thread.is_alive():
                logger.warning("ep_trl's rollout worker thread did not end within 60 s of stop()")

    def update_model_version(self, model_version: int) -> None:
        """The policy version the server now holds (the trainer calls it after each weight sync, once the server's
        weights, or the adapter of that version, have changed). On a server with ``--enable-lora`` the adapter the
        trainer loaded for this version is looked up first (``GET /v1/models``, retried if the server is briefly
        busy), so that no turn asks for a version's adapter before it is known; an adapter of that name the server
        served before this run (``adapters.foreign``) is not this run's and is never used."""
        shutdown.raise_if_terminating()  # the trainer's thread, after each sync: a swallowed SIGTERM ends it here
        version = int(model_version)
        self.adapters.synced(version)
        self._version = version

    def served_model(self, version: int) -> str | None:
        """The model a turn of policy ``version`` is generated with (``PolicyAdapters.model_for``)."""
        return self.adapters.model_for(version)

    def check_health(self, stale_after_s: float) -> None:
        """Raise, in the trainer's thread, what ended the worker, or that it released nothing for ``stale_after_s``;
        after a SIGTERM, ``Terminated`` (``ep_trl.runtime.shutdown.raise_if_terminating``)."""
        shutdown.raise_if_terminating()
        if self._error is not None:
            raise RolloutWorkerError(
                f"ep_trl's rollout worker for {self.env_path} stopped: {type(self._error).__name__}: {self._error}"
            ) from self._error
        if self._thread is None or not self._thread.is_alive():
            raise RolloutWorkerError(
                f"ep_trl's rollout worker for {self.env_path} is not running (start() was not called, or stop() was)."
            )
        quiet = time.monotonic() - self._heartbeat
        if quiet > stale_after_s:
            raise RolloutWorkerError(
                f"ep_trl's rollout worker for {self.env_path} produced nothing for {quiet:.0f} s (more than "
                f"{stale_after_s:g} s): no prompt group of {self._config.num_generations} episodes completed in that "
                "time. Raise AsyncGRPOConfig(heartbeat_stale_after_s=...) if episodes are that slow."
            )

    # --- what the worker measured ---------------------------------------------------------------------------------

    def slot_occupancy(self) -> float:
        """The share of the episode slots' time, since ``start()``, during which an episode was in flight."""
        if self._started_at is None:
            return 0.0
        wall = time.monotonic() - self._started_at
        return self.meter.busy_until_now() / (self.slots * wall) if wall > 0 else 0.0

    # --- the producer thread -----------------------------------------------------------------------------------

    def _produce(self) -> None:
        try:
            self.engine.run(self._stream())
        except BaseException as exc:  # whatever ended the worker is raised in the trainer's thread by check_health
            if not self._stopping.is_set():
                logger.error("ep_trl's rollout worker stopped: %s: %s", type(exc).__name__, exc)
                self._error = exc

    def _caller(self) -> DetachedCaller:
        """The worker as its engine's caller: the config, the current policy version, the server the
        trainer keeps on its weights, the metrics queue."""
        return DetachedCaller(
            self._config,
            self._version,
            SyncedServer(self._server_url),
            self._put_metrics,
            takes_rollout_images=self.renders_images,
            takes_processed_images=self.renders_images,
        )

    def _plans(self) -> Iterator[GroupPlan]:
        """The prompts of the dataset, in order and over again, one group of ``num_generations`` episodes each; the
        rows of each group are logged under the version current when it starts."""
        n = self._config.num_generations
        for group in itertools.count():
            yield GroupPlan(
                group=group,
                prompt=self._prompts[group % len(self._prompts)],
                indices=tuple(range(group * n, (group + 1) * n)),
                rollout_ids=tuple(evalprotocol.new_id("rollout") for _ in range(n)),
                context=self.engine.setup(self._caller()).context,
            )

    def _has_room(self) -> bool:
        """Whether another episode may start: nothing released waits for room, the buffer is not full, and under
        ``max_buffered_images`` the images buffered stay within it with one more episode's reservation."""
        if self._stopping.is_set() or self._pending or self._buffer.full():
            return False
        if self.max_buffered_images is None:
            return True
        bounded = self.bounded_images()
        assert bounded is not None and self.max_episode_images is not None  # both set whenever max_buffered_images is
        return bounded + self.max_episode_images <= self.max_buffered_images

    def buffered_images(self) -> int:
        """Images held by the samples in the buffer and by those released, waiting for room (read in that order
        from another thread, a sample moving into the buffer is counted twice, never missed)."""
        pending = tuple(self._pending)
        with self._buffer.mutex:
            buffered = tuple(self._buffer.queue)
        return images_in(pending) + images_in(buffered)

    def bounded_images(self) -> int | None:
        """An upper bound on the images the worker holds now, what ``max_buffered_images`` bounds; an image is its
        decoded form with the pixel tensors the processing class made of it (one copy: the samples carry the tensors
        their episodes' renders made). Counted: the images of the samples in the buffer and of the released ones
        waiting for room (each sample's own), plus ``max_episode_images`` for each episode started and not yet
        released (an episode never holds more: a turn that would is not sent; its pixels live from the turn that
        brought the image). Holding none: released groups past their samples (the metrics window keeps their
        episodes without images, pixels, messages or rows), the rollout log's rows (their messages hold the sources
        the eval wrote, data URIs, never decoded images), the chat template's decode cache (weak). Not counted:
        samples the trainer took (the trainer's), passing copies while an image is decoded or processed, the one
        copy that joins an ended episode's several images' pixels into one row (its per-image tensors are freed with
        the episode), and the encoded sources in the messages of episodes in flight and in log rows queued for
        writing. None without ``max_episode_images``."""
        if self.max_episode_images is None:
            return None
        unreleased = self.meter.episodes - self._released_episodes  # before the samples: a release is never missed
        return self.buffered_images() + self.max_episode_images * unreleased

    async def _stream(self) -> None:
        pump = asyncio.ensure_future(self._pump())
        window: list[tuple[Reported, ReleaseRecord]] = []
        window_started, sessions_before = time.monotonic(), 0
        stream = self.engine.groups(
            self._caller(),
            self._plans(),
            slots=self.slots,
            may_start=self._has_room,
            turn_version=lambda: self._version,
            model_for=self.served_model,
            meter=self.meter,
            max_episode_images=self.max_episode_images,
        )
        try:
            async with aclosing(stream):  # an error here cancels the episodes in flight before it goes on
                async for group in stream:
                    window.append((Reported.of(group), self._release(group, await self._samples(group))))
                    del group  # its images live on in its samples only
                    if len(window) >= self.groups_per_report:
                        sessions = self.engine.env_sessions
                        self._report(window, time.monotonic() - window_started, sessions - sessions_before)
                        window, window_started, sessions_before = [], time.monotonic(), sessions
        finally:
            pump.cancel()
            await asyncio.gather(pump, return_exceptions=True)

    async def _samples(self, group: ScoredGroup) -> "GroupSamples":
        """The group's samples, made in a thread of their own (``group_samples``): processing the images of its
        episodes takes CPU time the event loop must not spend, since it plays every episode in flight."""
        processing_class = self._config.processing_class if self.renders_images else None
        what = f"samples of prompt group {group.plan.group}"
        try:
            return await run_blocking(
                functools.partial(group_samples, group, self._config.tokenizer, processing_class),
                timeout_s=SAMPLES_TIMEOUT_S,
                what=what,
            )
        except TimeoutError as exc:
            raise RolloutWorkerError(
                f"Making the {what} took more than {SAMPLES_TIMEOUT_S:g} s (processing the images "
                "of its episodes, decoding their completions); the worker stops."
            ) from exc

    def _release(self, group: ScoredGroup, made: "GroupSamples") -> ReleaseRecord:
        """Hand a finished group's samples on, waiting for room in the buffer (``_pump``)."""
        self.engine.log_final(group.plan.context, group.episodes, group.scored, group.seconds)
        self._pending.extend(made.samples)
        self._released_episodes += len(group.played)  # after the samples are counted: bounded_images never undercounts
        self._heartbeat = time.monotonic()
        self.left_out += made.left_out
        self.image_mismatches += made.image_mismatches
        record = ReleaseRecord.of(group, made, self._version)
        self.groups.append(record)
        return record

    async def _pump(self) -> None:
        """Move released samples into the buffer as it has room, dropping those already too stale to train on. No
        local name keeps a sample (and its images) once it left the worker: the pump sleeps between rounds."""
        while True:
            while self._pending:
                if self._version - self._pending[0].model_version > self._max_staleness:
                    self._pending.popleft()
                    self.dropped_stale += 1  # the trainer would drop it too: no room is spent on it
                    continue
                self._pending[0].enqueued_at = time.time()
                try:
                    self._buffer.put_nowait(self._pending[0])
                except queue.Full:
                    break
                self._pending.popleft()
                self.samples_put += 1
            if self._pending or self._buffer.full():
                self._heartbeat = time.monotonic()  # waiting for the trainer counts as alive
            await asyncio.sleep(BUFFER_POLL_S)

    def _report(self, window: Sequence[tuple[Reported, ReleaseRecord]], seconds: float, env_sessions: int) -> None:
        """One step's worth of groups: the ``ep_trl/*`` numbers of a rollout call and the worker's own."""
        metrics = window_metrics(window, seconds, env_sessions)
        totals = {"samples": self.samples_put, "left_out": self.left_out, "dropped_stale": self.dropped_stale}
        if self.renders_images:
            totals["image_mismatch"] = self.image_mismatches
        metrics.update(
            {
                f"ep_trl/worker/{name}_total": float(value - self._reported.get(name, 0))  # TRL sums deltas
                for name, value in totals.items()
            }
        )
        self._reported = totals
        metrics["ep_trl/worker/slot_occupancy"] = self.slot_occupancy()
        if self.renders_images:
            metrics["ep_trl/worker/buffered_images"] = float(self.buffered_images())
        bounded = self.bounded_images()
        if bounded is not None:
            metrics["ep_trl/worker/bounded_images"] = float(bounded)
        self._put_metrics(metrics)
        episodes = [ep for g, _ in window for ep in g.episodes]
        scored = [s for g, _ in window for s in g.scored]
        logger.info(summary_line(self._version, episodes, scored, seconds, metrics))
        self.engine.observe_signal(episodes, scored)

    def _put_metrics(self, metrics: dict[str, float]) -> None:
        """Hand metrics to the trainer without ever waiting: a full queue loses its oldest entry (counted)."""
        self.metrics_dropped += put_dropping_oldest(self.metrics_queue, metrics)
