"""An eval with eval-protocol's NoOpRolloutProcessor: rows pass through without a model call."""

from eval_protocol.models import EvaluateResult, EvaluationRow, Message
from eval_protocol.pytest import NoOpRolloutProcessor, evaluation_test


@evaluation_test(
    input_messages=[[[Message(role="user", content="hi"), Message(role="assistant", content="hello")]]],
    rollout_processor=NoOpRolloutProcessor(),
    mode="pointwise",
)
def test_noop(row: EvaluationRow) -> EvaluationRow:
    row.evaluation_result = EvaluateResult(score=1.0, reason="present")
    return row
