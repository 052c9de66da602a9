"""Pointwise letters eval: score = mean step reward (+ ``bonus`` kwarg)."""

from eval_protocol.models import EvaluateResult, EvaluationRow
from eval_protocol.pytest import evaluation_test
from eval_protocol.pytest.openenv_rollout_processor import OpenEnvRolloutProcessor

from tests.evals import letters_parts as parts

TASKS = ["vowels", "digits"]


@evaluation_test(
    input_messages=parts.INPUT_MESSAGES,
    completion_params=parts.COMPLETION_PARAMS,
    rollout_processor=OpenEnvRolloutProcessor(
        env_factory=parts.make_env_factory(),
        prompt_builder=parts.prompt_builder,
        action_parser=parts.action_parser,
        tasks=TASKS,
        task_var=parts.TASK_VAR,
    ),
    steps=parts.STEPS,
    max_concurrent_rollouts=parts.MAX_CONCURRENT_ROLLOUTS,
    evaluation_test_kwargs=[{"bonus": 0.0}],
    mode="pointwise",
)
def test_letters_pointwise(row: EvaluationRow, bonus: float = 0.0) -> EvaluationRow:
    """Mean of the per-step rewards plus ``bonus``; an episode with no steps is an error."""
    rewards = parts.step_rewards(row)
    if not rewards:
        raise ValueError("letters eval: row has no step rewards (the episode took 0 steps)")
    mean = sum(rewards) / len(rewards)
    row.evaluation_result = EvaluateResult(
        score=mean + bonus,
        reason=f"mean of {len(rewards)} step rewards {rewards} = {mean:.4f}, bonus {bonus}",
        is_score_valid=True,
    )
    return row
