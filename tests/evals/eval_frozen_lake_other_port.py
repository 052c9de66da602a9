"""``eval_frozen_lake`` with its MCP-gym server on port 9713 instead of eval-protocol's default 9700 (the processor
reads ``rollout_processor_kwargs["port"]``), so a test can run it beside whatever holds 9700."""

from eval_protocol.models import EvaluateResult, EvaluationRow
from eval_protocol.pytest import evaluation_test
from eval_protocol.pytest.default_mcp_gym_rollout_processor import MCPGymRolloutProcessor

from tests.evals.eval_frozen_lake import ROWS, SERVER

PORT = 9713


@evaluation_test(
    input_rows=[ROWS],
    completion_params=[
        {"temperature": 0.0, "max_tokens": 32, "model": "fireworks_ai/accounts/fireworks/models/qwen3-8b"}
    ],
    rollout_processor=MCPGymRolloutProcessor(),
    rollout_processor_kwargs={"port": PORT},
    server_script_path=SERVER,
    steps=4,
    mode="pointwise",
    passed_threshold=0.0,
)
def test_frozen_lake_other_port(row: EvaluationRow) -> EvaluationRow:
    """1.0 when the agent reached the goal."""
    score = row.get_total_reward()
    row.evaluation_result = EvaluateResult(score=score, reason="goal" if score == 1.0 else "no goal")
    return row
