"""What ``EvalRolloutWorker`` records of each prompt group it releases (:class:`ReleaseRecord`), what its metrics
report keeps of a group until the step's window is reported (:class:`Reported`, with no image in any form), and the
window's ``ep_trl/*`` numbers."""

import dataclasses
import queue
import time
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.queues import Queue as MPQueue

from ..engine.metrics import call_metrics
from ..engine.stream import ScoredGroup
from ..evalprotocol.body import Scored
from ..trajectory.episode import Episode
from .samples import GroupSamples


@dataclass(frozen=True)
class ReleaseRecord:
    """What the worker recorded when it released one prompt group: its episodes and samples, each sample's version,
    the version then, and how long it took."""

    group: int
    episodes: int
    samples: int
    left_out: int
    versions: tuple[int, ...]  # each sample's model_version (its oldest turn's), in member order
    turn_versions: tuple[tuple[int, ...], ...]  # each sample's turns' versions, as sent (same order)
    version_at_release: int
    episode_seconds: tuple[float, ...]  # each episode's own duration, in member order
    seconds: float  # from its first episode's start to its release
    released_at: float  # time.monotonic()
    image_mismatches: int = 0  # episodes left out because their images did not match their image tokens

    @classmethod
    def of(cls, group: ScoredGroup, made: GroupSamples, version: int) -> "ReleaseRecord":
        """The record of ``group`` released with the samples ``made`` of it, at policy ``version``."""
        return cls(
            group.plan.group,
            len(group.played),
            len(made.samples),
            made.left_out,
            tuple(s.model_version for s in made.samples),
            made.turn_versions,
            version,
            tuple(ep.duration_s for ep in group.episodes),
            group.seconds,
            time.monotonic(),
            made.image_mismatches,
        )


@dataclass(frozen=True)
class Reported:
    """What the metrics report keeps of a released group until its window is reported: the episodes without their
    images, pixels or messages, the verdicts without their rows (the report reads neither; the messages and rows hold
    the eval's image sources, a screenshot's data URI each), and how long the group took."""

    episodes: tuple[Episode, ...]
    scored: tuple[Scored, ...]
    seconds: float

    @classmethod
    def of(cls, group: ScoredGroup) -> "Reported":
        """What the report needs of ``group``, holding none of its images in any form: the images and their pixel
        tensors live on in the group's samples only, their sources in the rollout log's rows until written."""
        episodes = tuple(
            dataclasses.replace(ep, trajectory=ep.trajectory.without_images(), messages=()) for ep in group.episodes
        )
        return cls(episodes, tuple(dataclasses.replace(s, row=None) for s in group.scored), group.seconds)


def window_metrics(
    window: Sequence[tuple[Reported, ReleaseRecord]], seconds: float, env_sessions: int
) -> dict[str, float]:
    """One step's worth of released groups: the ``ep_trl/*`` numbers of a rollout call, each group's mean seconds
    and the samples' mean version lag at release."""
    metrics = call_metrics(
        [ep for g, _ in window for ep in g.episodes], [s for g, _ in window for s in g.scored], seconds, env_sessions
    )
    lags = [r.version_at_release - v for _, r in window for v in r.versions]
    metrics["ep_trl/worker/group_s"] = sum(g.seconds for g, _ in window) / len(window)
    metrics["ep_trl/worker/version_lag"] = sum(lags) / len(lags) if lags else 0.0
    return metrics


def put_dropping_oldest(bounded: queue.Queue | MPQueue, metrics: dict[str, float]) -> int:
    """Put ``metrics`` without ever waiting: a full queue loses its oldest entries first. The number dropped."""
    dropped = 0
    while True:
        try:
            bounded.put_nowait(metrics)
            return dropped
        except queue.Full:
            try:
                bounded.get_nowait()
                dropped += 1
            except queue.Empty:
                continue
