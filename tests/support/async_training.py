"""What the asynchronous training tests record (every sample the worker put on its buffer, the policy of each version
the trainer synced), the rule that tells which policy sampled a turn, released groups built as the stream releases
them, and a wait for a condition."""

import queue
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from transformers import TrainerCallback


class Recorded(queue.Queue):
    """The worker's buffer, keeping every sample put on it (the trainer drains it as usual)."""

    def __init__(self, maxsize):
        super().__init__(maxsize)
        self.samples = []

    def put(self, item, block=True, timeout=None):
        super().put(item, block, timeout)
        self.samples.append(item)


class VersionSnapshots(TrainerCallback):
    """The policy of each version: version 1 is the initial weights (the first sync), version k+1 the weights after
    step k. ``model_class`` loads the checkpoint (``AutoModelForCausalLM``, ``AutoModelForImageTextToText``)."""

    def __init__(self, model_dir, model_class):
        self.states = {1: model_class.from_pretrained(model_dir).state_dict()}

    def on_step_end(self, args, state, control, model=None, **kwargs):
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
    assert first_by, (version, list(recorded), list(next_one))
    return TurnSource(first_by[0], held=True, told_apart=False)


def released_group(group: int, prompt: str, trajectories: Sequence[Any], scores: Sequence[float],
                   versions: tuple[int, ...] = (1,)) -> Any:
    """A prompt group as the stream releases it (``ep_trl.engine.stream.ScoredGroup``): one finished, scored episode per
    trajectory, each turn sent under ``versions``; only what ``group_samples`` reads is filled in."""
    from ep_trl.sources.episode import Episode, EpisodePlan
    from ep_trl.engine.scoring import Scored
    from ep_trl.engine.stream import GroupPlan, PlayedEpisode, ScoredGroup

    played = []
    for generation, trajectory in enumerate(trajectories):
        plan = EpisodePlan(index=generation, group=group, generation=generation, task=None, initial_messages=())
        episode = Episode(plan=plan, trajectory=trajectory, messages=(), step_rewards=(), actions=(),
                          status="finished", stop_reason="done", error=None, error_kind=None, duration_s=0.0,
                          prompt_tokens=len(trajectory.prompt_ids))
        played.append(PlayedEpisode(request=None, episode=episode, row=None, versions=versions))
    plan = GroupPlan(group=group, prompt=prompt, indices=tuple(range(len(trajectories))),
                     rollout_ids=tuple(f"rollout-{group}-{k}" for k in range(len(trajectories))), context=None)
    return ScoredGroup(plan, tuple(played), tuple(Scored(score, None) for score in scores), seconds=0.0)


def wait_until(condition, timeout_s):
    """Return once ``condition()`` holds; fail the test after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)
