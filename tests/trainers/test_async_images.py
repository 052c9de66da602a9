"""The async image seam (ep_trl.trainers.async_images), pinned against the installed TRL, without a vLLM server.

A stand-in rollout worker (``QueuedSamples``: TRL's worker protocol over a queue the test fills) hands the real
``CPUAsyncImagesGRPOTrainer`` samples made by ``EvalRolloutWorker``'s own ``group_samples`` from released groups: a
prompt with a screenshot rendered by the tiny VLM's processor, a sampled completion, its logprobs teacher-forced WITH
the pixels on the initial weights. The two samples of a group have the same ids and different screenshots: TRL's
prefix sharing would show one the other's pixels. At step 1 the trainer's weights are the ones the logprobs came
from, so TRL's ``ratio`` is 1 and the trainer's ``sampling/sampling_logp_difference`` is ~0 only if every forward saw
each sample's own pixels; with the two samples' pixels traded (fault injection) it is not. An instrument around the
image processor counts each image processed once from the worker's samples to the forward. The real-server run is in
tests/generation/test_vllm_images.py.
"""

import dataclasses
import gc
import queue
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, cast

import numpy as np
import pytest
from datasets import Dataset
from transformers import AutoModelForImageTextToText, AutoProcessor, AutoTokenizer, TrainerCallback
from trl.experimental.async_grpo import AsyncGRPOConfig

from ep_trl import ConfigError
from ep_trl.adapters import trl_seam
from ep_trl.adapters.samples import group_samples
from ep_trl.trainers.async_images import CPUAsyncImagesGRPOTrainer, UnsharedTreeRow
from ep_trl.trajectory.sample_images import ids_with_images, images_of
from ep_trl.trajectory.template import ChatTemplate
from ep_trl.trajectory.tokens import Trajectory
from tests.support.async_training import released_group
from tests.support.images import ImageProcessorCalls, png_data_uri, token_logprobs, user_with_image

if TYPE_CHECKING:
    from collections.abc import Iterable

    import torch
    from transformers import PreTrainedModel, ProcessorMixin, TrainerControl, TrainerState, TrainingArguments
    from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

    from ep_trl.engine.stream import ScoredGroup
    from ep_trl.trajectory.sample_images import ImageIds, ProcessedImages

TOLERANCE = 1e-3


class QueuedSamples:
    """A stand-in for ``EvalRolloutWorker`` (TRL's ``RolloutWorkerProtocol``): the samples the test put on its
    queue, nothing else."""

    renders_images: bool  # unset unless a test sets it: EvalRolloutWorker's say on whether it renders images

    def __init__(self) -> None:
        self.rollout_buffer: queue.Queue[RolloutSample] = queue.Queue()
        self.metrics_queue: queue.Queue[dict[str, Any]] = queue.Queue()
        self.versions: list[int] = []

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def update_model_version(self, version: int) -> None:
        self.versions.append(version)

    def check_health(self, stale_after_s: float) -> None:
        pass


class SentWeights:
    """A weight transfer that keeps the names of the tensors each sync sends (no server)."""

    def __init__(self) -> None:
        self.names: list[list[str]] = []

    def init_weight_transfer(self) -> None:
        pass

    def pause(self) -> None:
        pass

    def send_weights(self, iterator: "Iterable[tuple[str, torch.Tensor]]") -> None:
        self.names.append([name for name, _ in iterator])

    def resume(self) -> None:
        pass

    def destroy(self) -> None:
        pass


def config(tmp_path: Path, **overrides: Any) -> AsyncGRPOConfig:
    values = dict(
        output_dir=str(tmp_path / "out"),
        use_cpu=True,
        bf16=False,
        token_budget=0,
        num_generations=2,
        per_device_train_batch_size=4,
        max_steps=1,
        logging_steps=1,
        learning_rate=1e-2,
        temperature=1.0,
        report_to=[],
        save_strategy="no",
        vllm_server_base_url="http://127.0.0.1:1",
    )
    return AsyncGRPOConfig(**{**values, **overrides})


def make_trainer(
    model_dir: Path,
    tmp_path: Path,
    processing_class: "ProcessorMixin",
    worker: QueuedSamples | None = None,
    weight_transfer: SentWeights | None = None,
    **overrides: Any,
) -> CPUAsyncImagesGRPOTrainer:
    return CPUAsyncImagesGRPOTrainer(
        str(model_dir),
        args=config(tmp_path, **overrides),
        processing_class=processing_class,
        rollout_worker=worker or QueuedSamples(),
        weight_transfer=weight_transfer or SentWeights(),
        train_dataset=Dataset.from_dict({"prompt": ["Task"] * 4}),
    )


def played_groups(model_dir: Path, groups: int) -> "tuple[list[ScoredGroup], ProcessorMixin, PreTrainedModel]":
    """``groups`` prompt groups of two episodes as the stream releases them (per group one prompt text, two
    screenshots; a sampled completion whose logprobs are teacher-forced WITH the pixels on the initial weights), the
    processor and the model."""
    processor = AutoProcessor.from_pretrained(model_dir)
    model = AutoModelForImageTextToText.from_pretrained(model_dir).eval()
    template = ChatTemplate(processor)
    completion = tuple(processor.tokenizer.encode("click('13')"))
    released = []
    for group in range(groups):
        trajectories = []
        for generation in range(2):
            color = (40 * group, 255 - 40 * group, 120 * generation)  # no two episodes share a screenshot
            prompt = template.prompt([user_with_image(f"Task {group}", png_data_uri(color))])
            logprobs = token_logprobs(model, processor, list(prompt.ids) + list(completion), list(prompt.images))
            trajectories.append(
                Trajectory(
                    prompt.ids,
                    completion,
                    tuple(logprobs[len(prompt.ids) - 1 :]),
                    (1,) * len(completion),
                    images=prompt.images,
                )
            )
        released.append(released_group(group, f"Task {group}", trajectories, scores=(1.0, 0.0)))
    return released, processor, model


def worker_samples(released: "list[ScoredGroup]", processor: "ProcessorMixin") -> "list[RolloutSample]":
    """The samples EvalRolloutWorker makes of released groups (its ``group_samples``: images processed once)."""
    return [sample for group in released for sample in group_samples(group, processor.tokenizer, processor).samples]


def image_samples(model_dir: Path, groups: int) -> "tuple[list[RolloutSample], ProcessorMixin, PreTrainedModel]":
    """``2 * groups`` samples as EvalRolloutWorker makes them, the processor and the model."""
    released, processor, model = played_groups(model_dir, groups)
    return worker_samples(released, processor), processor, model


def carrying_images_alone(sample: "RolloutSample") -> "RolloutSample":
    """``sample`` as a custom worker makes it: its ids carry its images, nothing processed."""
    ids = sample.input_ids
    return dataclasses.replace(sample, input_ids=ids_with_images(ids.tolist(), images_of(ids)))


def processed(sample: "RolloutSample") -> "ProcessedImages":
    """What the worker's processing made of the images ``sample``'s ids carry."""
    carried = cast("ImageIds", sample.input_ids).processed
    assert carried is not None
    return carried


def step_log(trainer: CPUAsyncImagesGRPOTrainer) -> dict[str, float]:
    return next(h for h in trainer.state.log_history if "ratio" in h)


class FreedBefore(TrainerCallback):
    """At the start of step ``step``, which of ``watched`` (weak references to images, pixels) are already freed."""

    def __init__(self, step: int, watched: "list[weakref.ref[Any]]") -> None:
        self.step, self.watched = step, watched
        self.freed: list[bool] | None = None

    def on_step_begin(
        self, args: "TrainingArguments", state: "TrainerState", control: "TrainerControl", **kwargs: Any
    ) -> None:
        if state.global_step + 1 == self.step:
            self.freed = [ref() is None for ref in self.watched]


def test_each_forward_sees_its_own_samples_pixels_and_the_vision_tower_trains(
    tiny_vlm_dir: Path, tmp_path: Path
) -> None:
    samples, processor, reference = image_samples(tiny_vlm_dir, groups=6)  # 2 steps, and the micro-batch TRL fetches
    # ahead of step 2
    first, second = samples[0], samples[1]  # one group: the same tokens, two screenshots
    ids = first.input_ids.tolist()
    text_only = token_logprobs(reference, processor, ids, list(images_of(first.input_ids)), pixels=False)
    start = int(np.argmax(first.completion_mask))
    assert max(abs(a - b) for a, b in zip(text_only[start - 1 :], first.old_log_probs[start:])) > 0.1  # pixels matter
    assert first.input_ids.tolist() == second.input_ids.tolist()  # only the pixels tell the two apart
    assert max(abs(first.old_log_probs - second.old_log_probs)) > 0.1  # and each one's pixels move its logprobs
    samples[2] = carrying_images_alone(samples[2])  # a custom worker's sample: processed by the collator
    stale, _, _ = image_samples(tiny_vlm_dir, groups=1)  # sampled by a policy 10 versions older: TRL drops them
    stale = [dataclasses.replace(sample, model_version=-9, group_id=100) for sample in stale]
    dropped: list[weakref.ref[Any]] = [weakref.ref(image) for s in stale for image in images_of(s.input_ids)]
    dropped += [weakref.ref(processed(s).pixels["pixel_values"]) for s in stale]
    watched = [weakref.ref(image) for s in samples for image in images_of(s.input_ids)]
    worker, sent = QueuedSamples(), SentWeights()
    for sample in [*stale, *samples]:
        worker.rollout_buffer.put(sample)
    del samples, first, second, stale, sample
    at_step_2 = FreedBefore(2, watched[:4] + dropped)  # step 1's micro-batch, and the samples TRL dropped as stale
    trainer = make_trainer(tiny_vlm_dir, tmp_path, processor, worker, sent, max_steps=2)
    trainer.add_callback(at_step_2)
    assert trainer.model is not None
    vision = {k: v.detach().clone() for k, v in trainer.model.named_parameters() if ".vision_model." in k}
    assert vision and all(p.requires_grad for k, p in trainer.model.named_parameters() if ".vision_model." in k)
    trainer.train()
    log = step_log(trainer)
    assert abs(log["ratio"] - 1.0) < 1e-4 and log["kl"] < 1e-6, log
    assert log["sampling/sampling_logp_difference/max"] < TOLERANCE, log
    moved = {k: (trainer.model.get_parameter(k) - v).abs().max().item() for k, v in vision.items()}
    assert max(moved.values()) > 0, "the step left the vision tower's weights unchanged"
    assert any(".vision_model." in name for name in sent.names[-1])  # the vision weights reach the server too
    assert log["sample/dropped_stale_total"] == 2
    # during training, without a collection: the images of step 1's samples, and the images and pixels of the stale
    # ones, are freed by then
    assert at_step_2.freed == [True] * 8, at_step_2.freed
    del trainer, worker
    gc.collect()
    trained = watched[:8]  # steps 1 and 2 (TRL had fetched the third micro-batch, untrained, when training ended)
    assert [r() for r in trained] == [None] * 8


def test_a_sample_trained_with_another_samples_pixels_is_caught(tiny_vlm_dir: Path, tmp_path: Path) -> None:
    """Fault injection (``swapped``): the two samples of each group trade pixels, each keeping its own tokens and
    sampled logprobs. The forward then computes the other screenshot's logprobs, and the trainer's
    sampling_logp_difference (from that same forward) reports it, where it reads < 1e-3 with each sample's own pixels
    (the test above): its own pixels, not any pixels, are what reach each sample's tokens."""
    samples, processor, _ = image_samples(tiny_vlm_dir, groups=2)

    # the fault: another sample's images (and their processed pixels) on these ids
    def swapped(sample: "RolloutSample", other: "RolloutSample") -> "RolloutSample":
        return dataclasses.replace(
            sample,
            input_ids=ids_with_images(
                sample.input_ids.tolist(), images_of(other.input_ids), cast("ImageIds", other.input_ids).processed
            ),
        )

    worker = QueuedSamples()
    for k in range(0, len(samples), 2):
        worker.rollout_buffer.put(swapped(samples[k], samples[k + 1]))
        worker.rollout_buffer.put(swapped(samples[k + 1], samples[k]))
    trainer = make_trainer(tiny_vlm_dir, tmp_path, processor, worker, per_device_train_batch_size=2)
    trainer.train()
    log = step_log(trainer)
    assert log["sampling/sampling_logp_difference/max"] > 0.1, log
    assert abs(log["ratio"] - 1.0) > 1e-3, log


def test_each_image_is_processed_once_from_the_worker_to_the_forward(tiny_vlm_dir: Path, tmp_path: Path) -> None:
    """An instrument around the real image processor counts the images processed from the moment the worker makes
    its samples (``group_samples``) through the trainer's collator and forward passes: each image once. A custom
    worker's sample that carries its images alone is processed once too, by the collator."""
    released, processor, _ = played_groups(tiny_vlm_dir, groups=4)
    custom = [carrying_images_alone(sample) for sample in worker_samples(released[:1], processor)]
    calls = ImageProcessorCalls(processor)  # what rendered and made the samples above is not counted
    samples = custom + worker_samples(released[1:], processor)  # custom ones in the first, trained micro-batch
    images = sum(len(images_of(sample.input_ids)) for sample in samples)
    worker = QueuedSamples()
    for sample in samples:
        worker.rollout_buffer.put(sample)
    trainer = make_trainer(tiny_vlm_dir, tmp_path, processor, worker)
    trainer.train()
    assert step_log(trainer)["sampling/sampling_logp_difference/max"] < TOLERANCE  # the forward saw the pixels
    assert calls.images == images, (calls.images, images, calls.calls)


class FakeWeightTransferClient:
    """A fake of TRL's NCCL ``WeightTransferClient``, named as such: built as TRL builds it (the client, the manifest
    the server sizes its receive buffers from, the timeout), it keeps the manifest and records the name, dtype and
    shape of every tensor each sync sends. No NCCL, no server."""

    built: ClassVar[list["FakeWeightTransferClient"]] = []

    def __init__(self, vllm_client: object, weight_update_info: dict[str, Any], weight_sync_timeout: float) -> None:
        self.manifest = weight_update_info
        self.sent: list[list[tuple[str, str, list[int]]]] = []
        FakeWeightTransferClient.built.append(self)

    def init_weight_transfer(self) -> None:
        pass

    def pause(self) -> None:
        pass

    def send_weights(self, iterator: "Iterable[tuple[str, torch.Tensor]]") -> None:
        self.sent.append([(name, str(tensor.dtype).split(".")[-1], list(tensor.shape)) for name, tensor in iterator])

    def resume(self) -> None:
        pass

    def destroy(self) -> None:
        pass


def test_the_nccl_weight_manifest_covers_every_trainable_weight_under_the_checkpoints_names(
    tiny_vlm_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With TRL's own NCCL transfer (no weight_transfer given; its client a fake), the manifest TRL built over the
    text model alone is rebuilt once the vision tower is unfrozen: each sync sends exactly the manifest, in its order,
    dtypes and shapes, and its names are every trainable weight, vision tower included, under the checkpoint's
    names (what the vLLM server loads)."""
    import trl.experimental.async_grpo.async_grpo_trainer as trainer_module
    from safetensors import safe_open

    monkeypatch.setattr(trainer_module, "WeightTransferClient", FakeWeightTransferClient)
    monkeypatch.setattr(FakeWeightTransferClient, "built", [])
    samples, processor, _ = image_samples(tiny_vlm_dir, groups=4)  # one step, and the micro-batch TRL fetches ahead
    worker = QueuedSamples()
    for sample in samples:
        worker.rollout_buffer.put(sample)
    trainer = CPUAsyncImagesGRPOTrainer(
        str(tiny_vlm_dir),
        args=config(tmp_path),
        processing_class=processor,
        rollout_worker=worker,
        train_dataset=Dataset.from_dict({"prompt": ["Task"] * 4}),
    )
    trls, rebuilt = FakeWeightTransferClient.built
    assert trainer.weight_transfer is rebuilt
    assert not any(".vision_model." in name for name in trls.manifest["names"])  # TRL froze the vision tower
    trainer.train()
    manifest = rebuilt.manifest
    assert len(rebuilt.sent) == 2  # the first sync, then one after the step
    for sent in rebuilt.sent:
        assert sent == list(zip(manifest["names"], manifest["dtype_names"], manifest["shapes"]))
    assert trainer.model is not None
    trainable = {name for name, p in trainer.model.named_parameters() if p.requires_grad}
    with safe_open(str(tiny_vlm_dir / "model.safetensors"), "pt") as checkpoint:
        stored = set(checkpoint.keys())
    assert set(manifest["names"]) == trainable == stored, set(manifest["names"]) ^ stored
    assert any(".vision_model." in name for name in manifest["names"])
    assert any(".connector." in name for name in manifest["names"])


def test_no_rollout_worker_is_refused_naming_the_eval_worker(tiny_vlm_dir: Path, tmp_path: Path) -> None:
    """Without a worker, TRL builds its own, which renders text prompts only: refused at construction."""
    with pytest.raises(
        ConfigError,
        match=r"needs rollout_worker=.*without a pixel\. Pass rollout_worker="
        r"EvalRolloutWorker\(env_path, args=args, processing_class=processing_class\)",
    ):
        CPUAsyncImagesGRPOTrainer(
            str(tiny_vlm_dir),
            args=config(tmp_path),
            processing_class=AutoProcessor.from_pretrained(tiny_vlm_dir),
            weight_transfer=SentWeights(),
            train_dataset=Dataset.from_dict({"prompt": ["Task"]}),
        )


def test_unshared_rows_keep_every_sample_whole_and_in_order() -> None:
    shared = {
        "input_ids": np.asarray([5, 6, 7, 8]),
        "completion_mask": np.asarray([0, 0, 1, 1]),
        "old_log_probs": np.zeros(4, dtype=np.float32),
        "advantage": 1.0,
        "group_id": 0,
    }
    other = {**shared, "input_ids": np.asarray([5, 6, 7, 9])}
    row = UnsharedTreeRow()
    row.add(shared)
    row.add(other)
    packed = row.pack()
    assert packed["input_ids"].tolist() == [5, 6, 7, 8, 5, 6, 7, 9]
    assert packed["position_ids"].tolist() == [0, 1, 2, 3, 0, 1, 2, 3]
    assert row.fits(shared, 12) and not row.fits(shared, 11)  # a third copy adds all its 4 tokens


def test_a_text_tokenizer_or_a_model_that_cannot_take_the_images_is_refused(
    tiny_vlm_dir: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    processor = AutoProcessor.from_pretrained(tiny_vlm_dir)
    with pytest.raises(ConfigError, match=r"a text tokenizer renders no images.*AutoProcessor\.from_pretrained"):
        # a text tokenizer where a processor belongs: what is refused
        make_trainer(tiny_vlm_dir, tmp_path, cast("ProcessorMixin", AutoTokenizer.from_pretrained(tiny_vlm_dir)))
    with pytest.raises(ConfigError, match=r"\w+ForCausalLM is a text-only model.*Pass a vision-language model"):
        make_trainer(tiny_model_dir, tmp_path, processor)
    text_worker = QueuedSamples()
    text_worker.renders_images = False  # as EvalRolloutWorker on a text tokenizer says
    with pytest.raises(ConfigError, match=r"the rollout worker renders no images.*Pass the same processing class"):
        make_trainer(tiny_vlm_dir, tmp_path, processor, text_worker)
    with pytest.raises(ConfigError, match=r"token_budget=0"):
        make_trainer(tiny_vlm_dir, tmp_path, processor, token_budget=None)


def test_the_async_image_path_is_gated_on_the_tested_trl() -> None:
    assert "async" in trl_seam.TESTED_TRL
    assert trl_seam.require_tested("async", "AsyncImagesGRPOTrainer") is not None


def test_a_batch_with_image_tokens_and_no_pixels_is_refused_not_trained(
    tiny_vlm_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Should a TRL build its batches without ep_trl's collator (simulated: TRL's own data loader, the fault), the
    images never reach the batch; the loss refuses it instead of training on image tokens without their pixels."""
    from trl.experimental.async_grpo import AsyncGRPOTrainer

    from ep_trl.errors import VersionError

    samples, processor, _ = image_samples(tiny_vlm_dir, groups=4)
    worker = QueuedSamples()
    for sample in samples:
        worker.rollout_buffer.put(sample)
    trainer = make_trainer(tiny_vlm_dir, tmp_path, processor, worker)
    monkeypatch.setattr(type(trainer), "get_train_dataloader", AsyncGRPOTrainer.get_train_dataloader)
    with pytest.raises(VersionError, match=r"image tokens and no vision inputs.*ImagesRolloutCollator"):
        trainer.train()
