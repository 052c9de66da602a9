"""What the asynchronous training tests record (every sample the worker put on its buffer, the policy of each version
the trainer synced), and released groups built as the stream releases them."""

import queue
from collections.abc import Sequence
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


def released_group(group: int, prompt: str, trajectories: Sequence[Any], scores: Sequence[float],
                   versions: tuple[int, ...] = (1,)) -> Any:
    """A prompt group as the stream releases it (``ep_trl.stream.ScoredGroup``): one finished, scored episode per
    trajectory, each turn sent under ``versions``; only what ``group_samples`` reads is filled in."""
    from ep_trl.episode import Episode, EpisodeSpec
    from ep_trl.scoring import Scored
    from ep_trl.stream import GroupPlan, PlayedEpisode, ScoredGroup

    played = []
    for generation, trajectory in enumerate(trajectories):
        spec = EpisodeSpec(index=generation, group=group, generation=generation, task=None, initial_messages=())
        episode = Episode(spec=spec, trajectory=trajectory, messages=(), step_rewards=(), actions=(),
                          status="finished", stop_reason="done", error=None, error_kind=None, duration_s=0.0,
                          prompt_tokens=len(trajectory.prompt_ids))
        played.append(PlayedEpisode(request=None, episode=episode, row=None, versions=versions))
    plan = GroupPlan(group=group, prompt=prompt, indices=tuple(range(len(trajectories))),
                     rollout_ids=tuple(f"rollout-{group}-{k}" for k in range(len(trajectories))), context=None)
    return ScoredGroup(plan, tuple(played), tuple(Scored(score, None) for score in scores), seconds=0.0)
