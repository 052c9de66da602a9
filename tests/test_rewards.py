"""Reward functions: the eval's score and step-reward aggregates, None (never 0) for unscored rollouts."""

from typing import TYPE_CHECKING

import pytest

from ep_trl.rewards import eval_score, step_reward_max, step_reward_mean, step_reward_sum

if TYPE_CHECKING:
    from collections.abc import Callable

COMPLETIONS = ["a", "b", "c"]
STEPS = [[0.5, 0.25], [], [1.0, 0.0, 0.5]]
STATUS = ["finished", "finished", "error"]


def test_eval_score_passes_scores_and_keeps_none() -> None:
    assert eval_score(COMPLETIONS, eval_score=[0.5, None, 1]) == [0.5, None, 1.0]


@pytest.mark.parametrize(("fn", "first"), [(step_reward_sum, 0.75), (step_reward_mean, 0.375), (step_reward_max, 0.5)])
def test_step_reward_aggregates(fn: "Callable[..., list[float | None]]", first: float) -> None:
    # an episode with no steps, or one that failed, has no reward rather than a reward of 0
    assert fn(COMPLETIONS, step_rewards=STEPS, episode_status=STATUS) == [first, None, None]
    assert fn.__name__.startswith("step_reward_")


def test_length_mismatch_is_an_error_naming_the_key() -> None:
    with pytest.raises(ValueError, match="2 eval_score values for 3 completions"):
        eval_score(COMPLETIONS, eval_score=[1.0, 0.0])
