"""An eval using eval-protocol's SingleTurnRolloutProcessor on the letters prompt."""

from eval_protocol.models import EvaluateResult, EvaluationRow
from eval_protocol.pytest import SingleTurnRolloutProcessor, evaluation_test

from tests.evals import letters_parts as parts


@evaluation_test(
    input_messages=parts.INPUT_MESSAGES,
    completion_params=parts.COMPLETION_PARAMS,
    rollout_processor=SingleTurnRolloutProcessor(),
    mode="pointwise",
)
def test_single_turn(row: EvaluationRow) -> EvaluationRow:
    """Scores 1.0 when the last message is a non-empty assistant reply."""
    last = row.messages[-1] if row.messages else None
    ok = last is not None and last.role == "assistant" and bool(last.content)
    row.evaluation_result = EvaluateResult(score=1.0 if ok else 0.0, reason="non-empty reply", is_score_valid=True)
    return row
