"""What one rollout call reports: the trainer's ``ep_trl/*`` metrics and one log line."""

import math
from collections.abc import Sequence

from .episode import FAILURE_KINDS, Episode
from .scoring import Scored


def call_metrics(episodes: Sequence[Episode], scored: Sequence[Scored], seconds: float,
                 env_sessions: int) -> dict[str, float]:
    """The per-call numbers the trainer logs beside its own (``ep_trl/...``); ``ep_trl/errors/<kind>`` counts the
    episodes that failed by each of ``FAILURE_KINDS``."""
    n = len(episodes)
    failed = sum(ep.status != "finished" for ep in episodes)
    unscored = sum(s.score is None for s in scored)
    return {
        "ep_trl/episodes_per_s": n / seconds if seconds > 0 else math.inf,
        "ep_trl/failed_fraction": failed / n,
        "ep_trl/unscored_fraction": unscored / n,
        "ep_trl/mean_turns": sum(ep.num_turns for ep in episodes) / n,
        "ep_trl/template_realigned": float(sum(ep.trajectory.realigned for ep in episodes)),
        "ep_trl/env_sessions_opened": float(env_sessions),
        **{f"ep_trl/errors/{kind}": float(sum(ep.error_kind == kind for ep in episodes)) for kind in FAILURE_KINDS},
    }


def summary_line(step: int, episodes: Sequence[Episode], scored: Sequence[Scored], seconds: float,
                 metrics: dict[str, float]) -> str:
    """One human line per call: episodes, speed, mean score, failures, turns."""
    n = len(episodes)
    scores = [s.score for s in scored if s.score is not None]
    failed = sum(ep.status != "finished" for ep in episodes)
    mean = f"{sum(scores) / len(scores):.3f}" if scores else "n/a"
    return (f"ep_trl step {step}: {n} episodes in {seconds:.1f} s ({metrics['ep_trl/episodes_per_s']:.2f}/s), "
            f"mean score {mean}, {failed} failed, {n - len(scores)} unscored, "
            f"{metrics['ep_trl/mean_turns']:.1f} turns/episode")
