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
        "ep_trl/stopped_by_token_budget": float(sum(ep.stop_reason == "token_budget" for ep in episodes)),
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


def budget_warning(episodes: Sequence[Episode], budget: int) -> str | None:
    """Say when episodes were cut short by the token budget, with the numbers and the setting to raise."""
    stopped = [ep for ep in episodes if ep.stop_reason == "token_budget"]
    if not stopped:
        return None
    n = len(stopped)
    turns = sum(ep.num_turns for ep in stopped) / n
    prompt = sum(len(ep.trajectory.prompt_ids) for ep in stopped) / n
    used = sum(len(ep.trajectory.completion_ids) for ep in stopped) / n
    bridge = sum(ep.budget_blocked_tokens for ep in stopped) / n
    return (f"{n} of {len(episodes)} episodes stopped early at the token budget of {budget} completion tokens, after "
            f"{turns:.1f} turns on average (prompt {prompt:.0f} tokens, {used:.0f} completion tokens used, the next "
            f"turn's message and template needed {bridge:.0f} more). Raise GRPOConfig(max_completion_length=...) or "
            "max_episode_tokens=..., or make the prompt builder's message between turns shorter.")
