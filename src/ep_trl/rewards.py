"""Reward functions for ``GRPOTrainer(reward_funcs=[...])`` that read what the rollout function returned.

TRL forwards every extra key of the rollout output to reward functions as a keyword argument. Each function
returns None for a rollout that has no score (a failed episode, or a row the eval left unscored); TRL 1.16
excludes such rows from the group baseline and gives them zero advantage, instead of treating them as 0.
"""

from collections.abc import Callable, Sequence


def eval_score(completions: Sequence[object], eval_score: Sequence[float | None], **_: object) -> list[float | None]:
    """The eval body's own score for each rollout."""
    _check_length(completions, eval_score, "eval_score")
    return [None if s is None else float(s) for s in eval_score]


def _step_reward(name: str, aggregate: Callable[[Sequence[float]], float]) -> Callable[..., list[float | None]]:
    def reward(
        completions: Sequence[object],
        step_rewards: Sequence[Sequence[float]],
        episode_status: Sequence[str] | None = None,
        **_: object,
    ) -> list[float | None]:
        _check_length(completions, step_rewards, "step_rewards")
        statuses = episode_status or ["finished"] * len(step_rewards)
        return [
            float(aggregate(r)) if status == "finished" and len(r) > 0 else None
            for r, status in zip(step_rewards, statuses)
        ]

    reward.__name__ = reward.__qualname__ = name
    reward.__doc__ = f"The {name.removeprefix('step_reward_')} of the environment's per-step rewards (None if failed)."
    return reward


step_reward_sum = _step_reward("step_reward_sum", sum)
step_reward_mean = _step_reward("step_reward_mean", lambda r: sum(r) / len(r))
step_reward_max = _step_reward("step_reward_max", max)


def _check_length(completions: Sequence[object], values: Sequence[object], key: str) -> None:
    if len(values) != len(completions):
        raise ValueError(
            f"reward function got {len(values)} {key} values for {len(completions)} completions; "
            "use it with a rollout_func from ep_trl.create_openenv_vllm_rollout_func"
        )


__all__ = ["eval_score", "step_reward_max", "step_reward_mean", "step_reward_sum"]
