"""What one rollout call reports: the trainer's ``ep_trl/*`` metrics, one log line, warnings about lost
episodes, and whether training still has anything to learn from (``SignalWatch``)."""

import logging
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import NoTrainingSignalError
from ..evalprotocol.body import Scored
from ..runtime.threads import stuck_threads
from ..trajectory.episode import FAILURE_KINDS, Episode

logger = logging.getLogger(__name__)

#: What to do about each kind of episode failure, quoted when a call went badly.
FIXES = {
    "environment": "check that the environment, tool or MCP servers are up and reachable (the errors name them); if "
    "an OpenEnv server is only slow, raise EvalOverrides(request_timeout_s=...)",
    "eval_code": "the eval's own code raised (its action parser, or its rollout processor): make it handle any "
    "model output (the errors show where); a processor failing before its first model call may be "
    "calling a model other than the one ep_trl gives the row (docs/processors.md)",
    "generation": "check the generation backend (for vLLM: is the server up, does the prompt fit max_model_len?)",
    "unscored": "the eval body left the rows unscored (raised, timed out, returned no or a non-finite score): the "
    "reasons are below",
}


def call_metrics(
    episodes: Sequence[Episode], scored: Sequence[Scored], seconds: float, env_sessions: int
) -> dict[str, float]:
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
        "ep_trl/forked_segments": float(sum(ep.forked_segments for ep in episodes)),
        **{f"ep_trl/errors/{kind}": float(sum(ep.error_kind == kind for ep in episodes)) for kind in FAILURE_KINDS},
        "ep_trl/stuck_threads": float(stuck_threads()),
    }


def summary_line(
    step: int, episodes: Sequence[Episode], scored: Sequence[Scored], seconds: float, metrics: dict[str, float]
) -> str:
    """One human line per call: episodes, speed, mean score, failures, turns."""
    n = len(episodes)
    scores = [s.score for s in scored if s.score is not None]
    failed = sum(ep.status != "finished" for ep in episodes)
    mean = f"{sum(scores) / len(scores):.3f}" if scores else "n/a"
    kinds = ", ".join(
        f"{kind} {int(metrics[f'ep_trl/errors/{kind}'])}" for kind in FAILURE_KINDS if metrics[f"ep_trl/errors/{kind}"]
    )
    return (
        f"ep_trl step {step}: {n} episodes in {seconds:.1f} s ({metrics['ep_trl/episodes_per_s']:.2f}/s), "
        f"mean score {mean}, {failed} failed{f' ({kinds})' if kinds else ''}, {n - len(scores)} unscored, "
        f"{metrics['ep_trl/mean_turns']:.1f} turns/episode"
    )


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
    return (
        f"{n} of {len(episodes)} episodes stopped early at the token budget of {budget} completion tokens, after "
        f"{turns:.1f} turns on average (prompt {prompt:.0f} tokens, {used:.0f} completion tokens used, the next "
        f"turn's message and template needed {bridge:.0f} more). Raise GRPOConfig(max_completion_length=...) or "
        "max_episode_tokens=..., or make the prompt builder's message between turns shorter."
    )


def failure_summary(episodes: Sequence[Episode], scored: Sequence[Scored]) -> str:
    """What went wrong in a call, grouped by kind and message, each kind with what to do about it."""
    groups: dict[str, Counter[str]] = {}
    for ep, s in zip(episodes, scored):
        if ep.error_kind is not None:
            groups.setdefault(ep.error_kind, Counter())[_first_line(ep.error)] += 1
        elif s.score is None:
            groups.setdefault("unscored", Counter())[_first_line(s.error)] += 1
    lines = []
    for kind, messages in groups.items():
        lines.append(f"- {kind}: {sum(messages.values())} episode(s); fix: {FIXES[kind]}")
        lines.extend(f"    {count} x {message}" for message, count in messages.most_common(3))
    return "\n".join(lines)


def _first_line(text: str | None) -> str:
    return (text or "no reason given").strip().splitlines()[0][:300]


@dataclass
class SignalWatch:
    """Watches whether rollout calls still give training anything to learn from: warns when most of a call failed
    or went unscored, and raises ``NoTrainingSignalError`` after ``limit`` calls in a row with no score at all."""

    limit: int
    eval_name: str
    calls_without_signal: int = 0

    def observe(self, episodes: Sequence[Episode], scored: Sequence[Scored]) -> None:
        unscored = sum(s.score is None for s in scored)
        if unscored * 2 < len(scored):
            self.calls_without_signal = 0
            return
        summary = failure_summary(episodes, scored)
        self.calls_without_signal = self.calls_without_signal + 1 if unscored == len(scored) else 0
        if self.calls_without_signal >= self.limit:
            raise NoTrainingSignalError(
                f"{self.calls_without_signal} rollout calls in a row of {self.eval_name} produced no scored episode, "
                f"so training learns nothing (RolloutOptions(max_signal_free_calls={self.limit})). The last call:\n"
                f"{summary}"
            )
        logger.warning(
            "%d of %d episodes of this call failed or went unscored%s:\n%s",
            unscored,
            len(scored),
            f" ({self.calls_without_signal} such calls in a row; training stops at {self.limit})"
            if self.calls_without_signal
            else "",
            summary,
        )
