"""An eval with eval-protocol's RemoteRolloutProcessor: the model is called by a remote server."""

from eval_protocol.models import EvaluateResult, EvaluationRow, Message
from eval_protocol.pytest import evaluation_test
from eval_protocol.pytest.remote_rollout_processor import RemoteRolloutProcessor


@evaluation_test(
    input_messages=[[[Message(role="user", content="hi")]]],
    completion_params=[{"model": "fireworks_ai/accounts/fireworks/models/qwen3-8b"}],
    rollout_processor=RemoteRolloutProcessor(remote_base_url="http://127.0.0.1:9"),
    mode="pointwise",
)
def test_remote(row: EvaluationRow) -> EvaluationRow:
    row.evaluation_result = EvaluateResult(score=1.0, reason="present")
    return row
