"""A pointwise letters eval whose scoring body always raises."""

from eval_protocol.models import EvaluationRow
from eval_protocol.pytest import evaluation_test
from eval_protocol.pytest.openenv_rollout_processor import OpenEnvRolloutProcessor

from tests.evals import letters_parts as parts

SCORING_ERROR = "scoring exploded"


@evaluation_test(
    input_messages=parts.INPUT_MESSAGES,
    completion_params=parts.COMPLETION_PARAMS,
    rollout_processor=OpenEnvRolloutProcessor(
        env_factory=parts.make_env_factory(),
        prompt_builder=parts.prompt_builder,
        action_parser=parts.action_parser,
        tasks=["vowels"],
        task_var=parts.TASK_VAR,
    ),
    steps=parts.STEPS,
    max_concurrent_rollouts=parts.MAX_CONCURRENT_ROLLOUTS,
    mode="pointwise",
)
def test_letters_raising(row: EvaluationRow) -> EvaluationRow:
    """Fails on purpose after the rollout."""
    raise RuntimeError(SCORING_ERROR)
