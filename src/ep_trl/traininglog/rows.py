"""The eval-protocol rows of training rollouts, shaped for the ``ep logs`` UI: ids, statuses, scores, token view."""

import hashlib
import json
import os
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone

from ..evalprotocol.body import Scored, build_row, stamp_row
from ..evalprotocol.spec import EvalSpec
from ..generation import SamplingParams
from ..trajectory.episode import Episode, EpisodePlan
from ..trajectory.types import MessagesView, Prompt, Row, Settings, Tokenizer
from .writer import EpisodeTokens, RolloutLogWriter


class RowContext:
    """Builds the eval-protocol rows of one rollout call, shaped for the ``ep logs`` UI.

    One invocation id per rollout function (training run), one experiment id and run id ``step-N`` per training
    step (the policy's ``step`` the rows are made under; ``sampling`` and ``model_name`` are the trainer's), one row
    id per dataset prompt, one rollout id per episode. ``created_at`` is the episode's start and stays fixed across
    its updates, so the UI's default newest-first order does not reshuffle rows as they progress. ``pid`` lets ``ep
    logs`` mark rows still running when the training process dies as stopped.
    """

    def __init__(
        self,
        spec: EvalSpec,
        invocation_id: str,
        backend_name: str,
        *,
        step: int,
        tokenizer: Tokenizer,
        sampling: SamplingParams,
        model_name: str | None,
    ) -> None:
        self.spec = spec
        self.invocation_id = invocation_id
        self.step = step
        self._created: dict[str, datetime] = {}
        self._pid = os.getpid()
        self._description = (getattr(spec.body, "__doc__", None) or "").strip() or None
        self._tokenizer = tokenizer
        self.completion_params = {
            **spec.completion_params,
            "model": str(model_name or spec.completion_params.get("model", "policy")),
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k,
            "policy_step": self.step,
            "generation_backend": backend_name,
        }

    def row(
        self,
        plan: EpisodePlan,
        rollout_id: str,
        prompt: Prompt,
        messages: MessagesView,
        step_rewards: Sequence[float],
        ep_trl: Settings | None = None,
        usage: Mapping[str, int] | None = None,
        duration_s: float | None = None,
        source_row: Row = None,
    ) -> Row:
        """The row of one episode: built from ``messages``, or ``source_row`` (the eval's own row as its processor
        left it: ground truth, tools and metadata kept) with the training ids and metadata set on it."""
        from eval_protocol.models import Status

        info = {
            "status": "running",
            "task": plan.task,
            "group": plan.group,
            "member": plan.member,
            "global_step": self.step,
            **(ep_trl or {}),
        }
        stamp: Settings = dict(
            eval_name=self.spec.name,
            rollout_id=rollout_id,
            invocation_id=self.invocation_id,
            experiment_id=f"{self.invocation_id}-step{self.step}",
            run_id=f"step-{self.step}",
            completion_params=self.completion_params,
            extra={"step_rewards": list(step_rewards), "ep_trl": info},
            usage=usage,
            duration_s=duration_s,
        )
        if source_row is None:
            row = build_row(messages=messages, row_id=row_id(prompt), **stamp)
        else:
            row = stamp_row(source_row, **stamp)
        row.created_at = self._created.setdefault(rollout_id, datetime.now(timezone.utc))
        row.pid = self._pid
        row.input_metadata.session_data = {
            **(row.input_metadata.session_data or {}),
            "mode": self.spec.mode,
            "source": "ep_trl training",
        }
        if row.eval_metadata is not None:
            row.eval_metadata.description = self._description
            row.eval_metadata.status = Status.eval_running()
        return row

    def log_row(
        self,
        log: RolloutLogWriter,
        plan: EpisodePlan,
        rollout_id: str,
        prompt: Prompt,
        messages: MessagesView,
        step_rewards: Sequence[float],
    ) -> None:
        """Queue a running row. Only snapshots are taken here; the row is built on the writer thread, and only
        if no newer update of the episode has arrived by then (the episode's message dicts are never mutated,
        only appended, so a shallow snapshot suffices)."""
        self._created.setdefault(rollout_id, datetime.now(timezone.utc))
        messages, step_rewards = tuple(messages), tuple(step_rewards)
        log.log(rollout_id, lambda: self.row(plan, rollout_id, prompt, messages, step_rewards))

    def episode_row(self, episode: Episode, rollout_id: str, prompt: Prompt, source_row: Row = None) -> Row:
        """The episode's final row for the body (``source_row``: the processor's row, see ``row``)."""
        traj = episode.trajectory
        sampled_lps = [lp for lp, m in zip(traj.logprobs, traj.env_mask) if m]
        info = {
            "status": episode.status,
            "stop_reason": episode.stop_reason,
            "error": episode.error,
            "error_kind": episode.error_kind,
            "num_turns": episode.num_turns,
            "prompt_tokens": len(traj.prompt_ids),
            "sampled_tokens": traj.sampled_tokens,
            "inserted_tokens": len(traj.completion_ids) - traj.sampled_tokens,
            "turn_sampled_tokens": [len(s) for s in traj.sampled_segments()],
            "mean_sampled_logprob": sum(sampled_lps) / len(sampled_lps) if sampled_lps else None,
            "min_sampled_logprob": min(sampled_lps) if sampled_lps else None,
            "template_realigned": traj.realigned,
            "prompt_builder_failures": episode.prompt_builder_failures,
            "forked_segments": episode.forked_segments,
            "instance": episode.instance,
        }
        usage = {
            "prompt_tokens": episode.prompt_tokens,
            "completion_tokens": traj.sampled_tokens,
            "total_tokens": episode.prompt_tokens + traj.sampled_tokens,
        }
        return self.row(
            episode.plan,
            rollout_id,
            prompt,
            episode.messages,
            episode.step_rewards,
            info,
            usage,
            episode.duration_s,
            source_row,
        )

    def log_final(
        self, log: RolloutLogWriter, episodes: Sequence[Episode], scored: Sequence[Scored], seconds: float
    ) -> None:
        """Log each episode's scored row with its token view; ``agg_score`` is the mean valid score of the call
        (the step's batch), as eval-protocol sets it per experiment, so the UI's default pivot has values."""
        valid = [s.score for s in scored if s.score is not None]
        agg_score = sum(valid) / len(valid) if valid else None
        for ep, s in zip(episodes, scored):
            row = final_row(ep, s, agg_score)
            row.execution_metadata.experiment_duration_seconds = seconds
            tokens = EpisodeTokens(self._tokenizer, ep.trajectory.without_images())  # the view needs no pixels
            log.log(row.execution_metadata.rollout_id, _given(row), tokens)  # handed over, not copied


def final_row(episode: Episode, scored: Scored, agg_score: float | None = None) -> Row:
    """The row as the body returned it, marked finished or errored, with why it is unscored if it is.

    Statuses use the codes the ``ep logs`` UI names: FINISHED (100) "finished", INTERNAL (13) "error",
    SCORE_INVALID (102) "score invalid" for a body that marked its score invalid.
    """
    from eval_protocol.models import Status

    row = scored.row
    if episode.status == "finished":
        row.rollout_status = Status.rollout_finished()
    else:
        row.rollout_status = Status.rollout_error(episode.error or "episode failed")
    result = row.evaluation_result
    if row.eval_metadata is not None:
        if scored.score is not None:
            row.eval_metadata.status = Status.eval_finished()
        elif result is not None and result.is_score_valid is False:
            row.eval_metadata.status = Status.score_invalid(scored.error or "score is invalid")
        else:
            row.eval_metadata.status = Status.error(scored.error or "unscored")
    extra = dict(row.execution_metadata.extra or {})
    if scored.score is not None:
        extra["episode_reward"] = scored.score  # the Token Debug panel's header shows it
        if result is not None and agg_score is not None and result.agg_score is None:
            result.agg_score = agg_score
    if scored.error:
        extra["unscored_reason"] = scored.error
    row.execution_metadata.extra = extra
    return row


def _given(row: Row) -> Callable[[], Row]:
    """What the log writer calls for a row that is already built."""
    return lambda: row


def row_id(prompt: Prompt) -> str:
    """Stable per dataset prompt, so the generations of one prompt share a row id across steps."""
    digest = hashlib.sha1(json.dumps(prompt, sort_keys=True, default=str).encode()).hexdigest()
    return f"prompt-{digest[:12]}"
