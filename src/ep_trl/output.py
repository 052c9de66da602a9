"""The dict ``rollout_func`` returns to TRL: one entry per prompt, in prompt order.

``prompt_ids``, ``completion_ids``, ``logprobs`` and ``env_mask`` are what TRL trains on; every other key is
forwarded by TRL to the reward functions (``ep_trl.rewards``) as a keyword argument.
"""

from collections.abc import Sequence
from typing import Any

from .episode import Episode
from .scoring import Scored


def trl_output(episodes: Sequence[Episode], scored: Sequence[Scored], rollout_ids: Sequence[str]) -> dict[str, list[Any]]:
    trajectories = [ep.trajectory for ep in episodes]
    return {
        "prompt_ids": [list(t.prompt_ids) for t in trajectories],
        "completion_ids": [list(t.completion_ids) for t in trajectories],
        "logprobs": [list(t.logprobs) for t in trajectories],
        "env_mask": [list(t.env_mask) for t in trajectories],
        "eval_score": [s.score for s in scored],
        "step_rewards": [list(ep.step_rewards) for ep in episodes],
        "num_turns": [ep.num_turns for ep in episodes],
        "episode_status": [ep.status for ep in episodes],
        "template_realigned": [t.realigned for t in trajectories],
        "rollout_id": list(rollout_ids),
    }
