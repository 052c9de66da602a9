"""The dict ``rollout_func`` returns to TRL: one entry per prompt, in prompt order.

``prompt_ids``, ``completion_ids``, ``logprobs`` and ``env_mask`` are what TRL trains on; every other key is
forwarded by TRL to the reward functions (``ep_trl.rewards``) as a keyword argument, except ``images``: present when
some episode saw images (a vision-language model's screenshots), each sample's images in placeholder order across
prompt and completion, for ``ep_trl.trainers.images.RolloutImagesGRPOTrainer`` to put into the forward pass.
"""

from collections.abc import Sequence
from typing import Any

from ..evalprotocol.body import Scored
from ..trajectory.episode import Episode

#: The key of the per-sample images (what ``ep_trl.trainers.images`` reads).
IMAGES_KEY = "images"


def trl_output(
    episodes: Sequence[Episode], scored: Sequence[Scored], rollout_ids: Sequence[str], end_token_id: int
) -> dict[str, list[Any]]:
    """The dict for TRL. An episode that failed before the model's first turn has no completion; TRL reads the
    last id of every completion (an empty one crashes ``train()``), so such a row carries one placeholder: the
    end-of-turn token ``end_token_id``, logprob 0.0, ``env_mask`` 0 (no loss, no importance ratio, no entropy),
    with ``eval_score`` None (no reward: TRL leaves it out of the group baseline and gives it no advantage)."""
    trajectories = [ep.trajectory for ep in episodes]
    placeholder = [not t.completion_ids for t in trajectories]
    images = {IMAGES_KEY: [list(t.images) for t in trajectories]} if any(t.images for t in trajectories) else {}
    return {
        "prompt_ids": [list(t.prompt_ids) for t in trajectories],
        "completion_ids": [
            [end_token_id] if empty else list(t.completion_ids) for t, empty in zip(trajectories, placeholder)
        ],
        "logprobs": [[0.0] if empty else list(t.logprobs) for t, empty in zip(trajectories, placeholder)],
        "env_mask": [[0] if empty else list(t.env_mask) for t, empty in zip(trajectories, placeholder)],
        "eval_score": [s.score for s in scored],
        "step_rewards": [list(ep.step_rewards) for ep in episodes],
        "num_turns": [ep.num_turns for ep in episodes],
        "episode_status": [ep.status for ep in episodes],
        "episode_error": [ep.error for ep in episodes],
        "template_realigned": [t.realigned for t in trajectories],
        "instance": [None if ep.instance is None else dict(ep.instance) for ep in episodes],
        "rollout_id": list(rollout_ids),
        **images,
    }
