"""What the asynchronous training tests record (every sample the worker put on its buffer, the policy of each version
the trainer synced), the rule that tells which policy sampled a turn and the check of a run's turns against it
(``check_turn_versions``, shared by the text and the vision-language tests), released groups built as the stream
releases them, and a wait for a condition."""

import queue
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    import torch
    from transformers import PreTrainedModel


class Recorded(queue.Queue):
    """The worker's buffer, keeping every sample put on it (the trainer drains it as usual)."""

    def __init__(self, maxsize: int) -> None:
        super().__init__(maxsize)
        self.samples: list[Any] = []

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        super().put(item, block, timeout)
        self.samples.append(item)


class VersionSnapshots(TrainerCallback):
    """The policy of each version: version 1 is the initial weights (the first sync), version k+1 the weights after
    step k. ``model_class`` loads the checkpoint (``AutoModelForCausalLM``, ``AutoModelForImageTextToText``)."""

    def __init__(self, model_dir: "str | Path", model_class: type[Any]) -> None:
        self.states: dict[int, dict[str, torch.Tensor]] = {1: model_class.from_pretrained(model_dir).state_dict()}

    def on_step_end(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        model: "PreTrainedModel | None" = None,
        **kwargs: Any,
    ) -> None:
        assert model is not None
        self.states[state.global_step + 1] = {k: v.detach().clone() for k, v in model.state_dict().items()}


@dataclass(frozen=True)
class TurnSource:
    """Which policy sampled a turn the worker recorded under version ``v``: ``policy`` is ``v`` or ``v + 1`` (for a
    held turn, the one its first token matches); ``held``: in flight when a sync paused the server, so its tokens
    from the sync on match neither policy alone; ``told_apart``: exactly one of the two policies matches it."""

    policy: int
    held: bool
    told_apart: bool


def turn_source(recorded: Sequence[float], next_one: Sequence[float], version: int, tolerance: float) -> TurnSource:
    """The policy that sampled a turn recorded under ``version``, from its tokens' gaps to the teacher-forced
    logprobs of ``version`` (``recorded``) and of ``version + 1`` (``next_one``), in token order.

    Every token within ``tolerance`` of one policy: that one (the recorded one when both match). The server's
    weights change before the trainer calls ``update_model_version``, so a turn recorded under ``v`` may be
    ``v + 1``'s. A turn in flight when the trainer synced is held (pause mode "keep", as TRL's own client pauses)
    and finished on the new weights over the cache the old ones computed: from the sync on its logprobs are neither
    policy's alone, and only its first token must be one policy's (callers bound such turns: one per slot and
    sync). A turn whose first token matches neither fails the assertion."""
    if max(recorded) < tolerance or max(next_one) < tolerance:
        policy = version if max(recorded) < tolerance else version + 1
        return TurnSource(policy, held=False, told_apart=(max(recorded) < tolerance) != (max(next_one) < tolerance))
    first_by = [v for v, gaps in ((version, recorded), (version + 1, next_one)) if gaps[0] < tolerance]
    assert first_by, f"a turn recorded under {version} matches neither it nor the next version: {recorded}, {next_one}"
    return TurnSource(first_by[0], held=True, told_apart=False)


@dataclass(frozen=True)
class TurnGaps:
    """One sampled turn: the version the worker recorded for it, and its tokens' gaps to the teacher-forced logprobs of
    that version (``recorded``) and of the next one (``next_one``), in token order."""

    version: int
    recorded: tuple[float, ...]
    next_one: tuple[float, ...]


@dataclass(frozen=True)
class SampleTurns:
    """A sample's sampled turns in order, and the version the trainer sees on it (``sample.model_version``)."""

    model_version: int
    turns: tuple[TurnGaps, ...]


@dataclass(frozen=True)
class VersionCheck:
    """What ``check_turn_versions`` found: ``turns`` not held, ``told_apart`` of them matched by exactly one of the two
    policies; ``held``: per sync, named by the version it replaced, the turns held across it; ``exact``: per version,
    the index of the last sample with a turn (not held) of that version's own policy."""

    turns: int
    told_apart: int
    held: Mapping[int, int]
    exact: Mapping[int, int]


def check_turn_versions(samples: Sequence[SampleTurns], slots: int, tolerance: float) -> VersionCheck:
    """The rule of a run's recorded versions, on every turn of ``samples`` (a worker with ``slots`` episode slots):

    * each turn's logprobs are its recorded version's or the next one's, or it is held (``turn_source``);
    * a sample is tagged with its oldest turn's version, never newer than the policy that sampled that turn and at
      most one older: ``min(sampled_by) - 1 <= model_version <= min(sampled_by)``;
    * adjacent versions tell more than half the turns not held apart (a turn of near-certain tokens can match both;
      most do not), so the first two rules can fail;
    * a sync holds at most the turns then in flight, one per slot: at most ``slots`` turns per sync (the sync from
      the policy a held turn's first token matches to the next one), not only in total."""
    turns, told_apart = 0, 0
    held: dict[int, int] = {}
    exact: dict[int, int] = {}
    for index, sample in enumerate(samples):
        assert sample.turns, f"sample {index} has no sampled turn"
        sampled_by = []  # the policy whose logprobs each turn carries
        for turn in sample.turns:
            source = turn_source(turn.recorded, turn.next_one, turn.version, tolerance)
            sampled_by.append(source.policy)
            if source.held:  # in flight when the trainer synced away from source.policy
                held[source.policy] = held.get(source.policy, 0) + 1
                continue
            turns, told_apart = turns + 1, told_apart + source.told_apart
            if source.policy == turn.version:
                exact[turn.version] = index
        assert min(sampled_by) - 1 <= sample.model_version <= min(sampled_by), (
            f"sample {index} is tagged {sample.model_version}, its turns were sampled by {sampled_by}"
        )
    assert told_apart > turns / 2, f"adjacent versions tell only {told_apart} of {turns} turns apart"
    assert all(count <= slots for count in held.values()), f"turns held per sync {held}, more than {slots} slots"
    return VersionCheck(turns, told_apart, held, exact)


def released_group(
    group: int, prompt: str, trajectories: Sequence[Any], scores: Sequence[float], versions: tuple[int, ...] = (1,)
) -> Any:
    """A prompt group as the stream releases it (``ep_trl.engine.stream.ScoredGroup``): one finished, scored episode per
    trajectory, each turn sent under ``versions``; only what ``group_samples`` reads is filled in."""
    from ep_trl.engine.stream import GroupPlan, PlayedEpisode, ScoredGroup
    from ep_trl.evalprotocol.body import Scored
    from ep_trl.sources import EpisodeRequest
    from ep_trl.traininglog.rows import RowContext
    from ep_trl.trajectory.episode import Episode, EpisodePlan

    played = []
    for member, trajectory in enumerate(trajectories):
        plan = EpisodePlan(index=member, group=group, member=member, task=None, initial_messages=())
        episode = Episode(
            plan=plan,
            trajectory=trajectory,
            messages=(),
            step_rewards=(),
            actions=(),
            status="finished",
            stop_reason="done",
            error=None,
            error_kind=None,
            duration_s=0.0,
            prompt_tokens=len(trajectory.prompt_ids),
        )
        # group_samples reads neither the episode's request nor its group's row context: None stands in for both
        played.append(PlayedEpisode(request=cast(EpisodeRequest, None), episode=episode, row=None, versions=versions))
    group_plan = GroupPlan(
        group=group,
        prompt=prompt,
        indices=tuple(range(len(trajectories))),
        rollout_ids=tuple(f"rollout-{group}-{k}" for k in range(len(trajectories))),
        context=cast(RowContext, None),
    )
    return ScoredGroup(group_plan, tuple(played), tuple(Scored(score, None) for score in scores), seconds=0.0)


def wait_until(condition: "Callable[[], object]", timeout_s: float) -> None:
    """Return once ``condition()`` holds; fail the test after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)
