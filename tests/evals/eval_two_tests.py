"""Two eval tests in one module: a bridge must refuse to guess which to use."""

from eval_protocol.models import EvaluateResult, EvaluationRow
from eval_protocol.pytest import evaluation_test
from eval_protocol.pytest.openenv_rollout_processor import OpenEnvRolloutProcessor

from tests.evals import letters_parts as parts


def _processor() -> OpenEnvRolloutProcessor:
    """A fresh processor per eval (each keeps its own counters)."""
    return OpenEnvRolloutProcessor(
        env_factory=parts.make_env_factory(),
        prompt_builder=parts.prompt_builder,
        action_parser=parts.action_parser,
        tasks=["vowels"],
        task_var=parts.TASK_VAR,
    )


@evaluation_test(
    input_messages=parts.INPUT_MESSAGES,
    completion_params=parts.COMPLETION_PARAMS,
    rollout_processor=_processor(),
    steps=parts.STEPS,
    max_concurrent_rollouts=parts.MAX_CONCURRENT_ROLLOUTS,
)
def test_letters_first(row: EvaluationRow) -> EvaluationRow:
    """Sum of step rewards."""
    row.evaluation_result = EvaluateResult(score=sum(parts.step_rewards(row)), reason="sum", is_score_valid=True)
    return row


@evaluation_test(
    input_messages=parts.INPUT_MESSAGES,
    completion_params=parts.COMPLETION_PARAMS,
    rollout_processor=_processor(),
    steps=parts.STEPS,
    max_concurrent_rollouts=parts.MAX_CONCURRENT_ROLLOUTS,
)
def test_letters_second(row: EvaluationRow) -> EvaluationRow:
    """Constant score, just to be a second eval."""
    row.evaluation_result = EvaluateResult(score=1.0, reason="constant", is_score_valid=True)
    return row
