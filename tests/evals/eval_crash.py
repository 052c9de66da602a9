"""Like eval_letters, but every episode plays the ``crash`` task (env fails at step 2)."""

from eval_protocol.models import EvaluateResult, EvaluationRow
from eval_protocol.pytest import evaluation_test
from eval_protocol.pytest.openenv_rollout_processor import OpenEnvRolloutProcessor

from tests.evals import letters_parts as parts

TASKS = ["crash"]


@evaluation_test(
    input_messages=parts.INPUT_MESSAGES,
    completion_params=parts.COMPLETION_PARAMS,
    rollout_processor=OpenEnvRolloutProcessor(
        # The task is pinned client-side: the processor ignores ``tasks`` with an env_factory.
        env_factory=parts.make_env_factory(task_name="crash"),
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
def test_letters_crash(row: EvaluationRow, bonus: float = 0.0) -> EvaluationRow:
    """Mean step reward plus ``bonus`` (only reached if an episode survives)."""
    rewards = parts.step_rewards(row)
    if not rewards:
        raise ValueError("letters eval: row has no step rewards (the episode took 0 steps)")
    mean = sum(rewards) / len(rewards)
    row.evaluation_result = EvaluateResult(score=mean + bonus, reason=f"mean {mean:.4f}", is_score_valid=True)
    return row
