"""FrozenLake through MCPGymRolloutProcessor with eval-protocol's own FrozenLake MCP server, written the way
eval-protocol's ``benchmarks/test_frozen_lake.py`` is (its rows inline, its default ``per_run`` server mode)."""

import os

import eval_protocol
from eval_protocol.models import EvaluateResult, EvaluationRow, InputMetadata, Message
from eval_protocol.pytest import evaluation_test
from eval_protocol.pytest.default_mcp_gym_rollout_processor import MCPGymRolloutProcessor

SERVER = os.path.join(os.path.dirname(eval_protocol.__file__), "mcp_servers", "frozen_lake", "server.py")
SYSTEM = (
    "You are playing FrozenLake. Use the lake_move tool with action LEFT, DOWN, RIGHT or UP to reach the goal G "
    "without falling into a hole H."
)
ROWS = [
    EvaluationRow(
        messages=[Message(role="system", content=SYSTEM)],
        input_metadata=InputMetadata(
            row_id=f"lake-{seed}",
            dataset_info={
                "environment_context": {"game": "FrozenLake", "map_name": "4x4", "seed": seed},
                "user_prompt_template": "Current grid:\n{observation}\nChoose your next move.",
            },
        ),
    )
    for seed in (42, 7)
]


@evaluation_test(
    input_rows=[ROWS],
    completion_params=[
        {"temperature": 0.0, "max_tokens": 32, "model": "fireworks_ai/accounts/fireworks/models/qwen3-8b"}
    ],
    rollout_processor=MCPGymRolloutProcessor(),
    server_script_path=SERVER,
    steps=4,
    mode="pointwise",
    passed_threshold=0.0,
)
def test_frozen_lake(row: EvaluationRow) -> EvaluationRow:
    """1.0 when the agent reached the goal."""
    score = row.get_total_reward()
    row.evaluation_result = EvaluateResult(score=score, reason="goal" if score == 1.0 else "no goal")
    return row
