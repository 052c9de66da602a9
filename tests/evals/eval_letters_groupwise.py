"""Groupwise letters eval: each row's reward sum relative to the best in its group."""

from eval_protocol.models import EvaluateResult, EvaluationRow
from eval_protocol.pytest import evaluation_test
from eval_protocol.pytest.openenv_rollout_processor import OpenEnvRolloutProcessor

from tests.evals import letters_parts as parts


@evaluation_test(
    input_messages=parts.INPUT_MESSAGES,
    completion_params=parts.COMPLETION_PARAMS,
    rollout_processor=OpenEnvRolloutProcessor(
        env_factory=parts.make_env_factory(),
        prompt_builder=parts.prompt_builder,
        action_parser=parts.action_parser,
        tasks=["vowels", "digits"],
        task_var=parts.TASK_VAR,
    ),
    steps=parts.STEPS,
    max_concurrent_rollouts=parts.MAX_CONCURRENT_ROLLOUTS,
    mode="groupwise",
)
async def test_letters_groupwise(rows: list[EvaluationRow]) -> list[EvaluationRow]:
    """Score = sum of step rewards / best sum in the group (0 when the best is 0)."""
    sums = [sum(parts.step_rewards(r)) for r in rows]
    best = max(sums, default=0.0)
    for row, total in zip(rows, sums):
        score = total / best if best > 0 else 0.0
        row.evaluation_result = EvaluateResult(
            score=score,
            reason=f"reward sum {total:.4f} vs best {best:.4f} in a group of {len(rows)}",
            is_score_valid=True,
        )
    return rows
