"""The async worker's samples (``EvalRolloutWorker``): one ``RolloutSample`` per scored episode of a released group
(``group_samples``, images carried on its ``input_ids``), how many images samples carry (``images_in``), and the
buffer the trainer takes them from (``SampleBuffer``)."""

import logging
import math
import queue
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..engine.stream import ScoredGroup
from ..runtime import shutdown
from ..trajectory.types import ProcessingClass, Tokenizer
from . import trl_seam

if TYPE_CHECKING:  # named for the checker: TRL's async trainer is imported only where the worker is built
    from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GroupSamples:
    """The samples of a released group: one per scored, finished episode that sampled a token (and whose images
    match its image tokens), each one's turn versions, how many episodes were left out, and how many of those for
    their images."""

    samples: "tuple[RolloutSample, ...]"
    turn_versions: tuple[tuple[int, ...], ...]
    left_out: int
    image_mismatches: int = 0


def group_samples(
    group: ScoredGroup, tokenizer: Tokenizer, processing_class: "ProcessingClass | None" = None
) -> GroupSamples:
    """One ``RolloutSample`` per scored, finished episode of a released group that sampled a token (each tagged with
    the oldest version its turns were sent under). With a vision-language ``processing_class``, each sample's
    ``input_ids`` carry its episode's images and what the processing class made of them: what the episode's renders kept
    (``Trajectory.processed``), else processed here once (``ep_trl.trajectory.sample_images``),
    and an episode whose images do not match its image tokens is left out (logged, counted in ``image_mismatches``).
    The worker calls it in a thread, off its event loop (``EvalRolloutWorker._samples``)."""
    import numpy as np

    from ..trajectory.sample_images import ids_with_images, placeholder_mismatch, process_images

    sample_class = trl_seam.rollout_sample()
    valid = [s.score for s in group.scored if s.score is not None]
    mean = sum(valid) / len(valid) if valid else 0.0
    std = math.sqrt(sum((s - mean) ** 2 for s in valid) / len(valid)) if valid else 0.0
    prompt = group.plan.prompt
    messages = list(prompt) if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
    samples: "list[RolloutSample]" = []
    turns: list[tuple[int, ...]] = []
    mismatches = 0
    for played, verdict in zip(group.played, group.scored):
        trajectory = played.episode.trajectory
        if verdict.score is None or played.episode.status != "finished" or not any(trajectory.env_mask):
            continue
        prompt_ids, completion_ids = trajectory.prompt_ids, trajectory.completion_ids
        ids = prompt_ids + completion_ids
        processed = None
        if processing_class is not None:
            processed = trajectory.processed  # kept as the episode rendered its images, else processed now
            if processed is None and trajectory.images:
                processed = process_images(processing_class, trajectory.images)
            mismatch = placeholder_mismatch(processing_class, ids, processed)
            if mismatch is not None:
                logger.warning(
                    "Episode %d of prompt group %d is left out: its images do not match its image tokens (%s).",
                    played.episode.plan.member,
                    group.plan.group,
                    mismatch,
                )
                mismatches += 1
                continue
        samples.append(
            sample_class(
                prompt=messages,
                completion=[{"role": "assistant", "content": tokenizer.decode(list(completion_ids))}],
                input_ids=ids_with_images(ids, trajectory.images if processing_class is not None else (), processed),
                completion_mask=np.asarray((0,) * len(prompt_ids) + trajectory.env_mask, dtype=np.int64),
                old_log_probs=np.asarray((0.0,) * len(prompt_ids) + trajectory.logprobs, dtype=np.float32),
                advantage=float((verdict.score - mean) / (std + 1e-8)),
                model_version=min(played.versions),
                group_id=group.plan.group,
                metrics={"reward": float(verdict.score), "reward_std": float(std)},
                enqueued_at=None,
            )
        )
        turns.append(played.versions)
    return GroupSamples(tuple(samples), tuple(turns), len(group.played) - len(samples), mismatches)


class SampleBuffer(queue.Queue["RolloutSample"]):
    """The worker's ``rollout_buffer``. The trainer takes each sample from it in the thread it trains in, the one
    place it reaches ep_trl at every sample: taking one first raises a SIGTERM that code swallowed
    (``ep_trl.runtime.shutdown.raise_if_terminating``)."""

    def get(self, block: bool = True, timeout: float | None = None) -> "RolloutSample":
        shutdown.raise_if_terminating()
        return super().get(block, timeout)


def images_in(samples: "Iterable[RolloutSample]") -> int:
    """How many images ``samples`` carry on their ``input_ids``."""
    from ..trajectory.sample_images import images_of

    return sum(len(images_of(sample.input_ids)) for sample in samples)
