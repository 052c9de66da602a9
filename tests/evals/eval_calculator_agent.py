"""A tool-using agent over a calculator MCP server, written the way eval-protocol's agent examples are.

The MCP config is ``data/calc_mcp.json`` unless ``CALC_MCP_CONFIG`` names another (tests start the server on a
free port and write a config pointing at it).
"""

import os
from pathlib import Path

from eval_protocol.models import EvaluateResult, EvaluationRow, Message
from eval_protocol.pytest import AgentRolloutProcessor, evaluation_test

MCP_CONFIG = os.environ.get("CALC_MCP_CONFIG", str(Path(__file__).parent / "data" / "calc_mcp.json"))
SYSTEM = "Use the calculator tools, then answer with the number only."


@evaluation_test(
    input_rows=[
        [
            EvaluationRow(
                messages=[
                    Message(role="system", content=SYSTEM),
                    Message(role="user", content="What is (1 + 2) + (3 + 4)?"),
                ],
                ground_truth="10",
            )
        ]
    ],
    completion_params=[{"model": "fireworks_ai/accounts/fireworks/models/qwen3-8b"}],
    rollout_processor=AgentRolloutProcessor(),
    mcp_config_path=MCP_CONFIG,
    mode="pointwise",
    passed_threshold=0.0,
)
def test_calculator_agent(row: EvaluationRow) -> EvaluationRow:
    """1.0 for the right final answer alone; 0.5 for the right number among other words (the system prompt asks for
    the number only); 0.0 otherwise. The tool results the agent saw are in the row."""
    final = row.messages[-1]
    answer = (final.content or "").strip() if final.role == "assistant" else ""
    tools_used = sum(1 for m in row.messages if m.role == "tool")
    score = 1.0 if answer == row.ground_truth else 0.5 if row.ground_truth in answer.split() else 0.0
    row.evaluation_result = EvaluateResult(score=score, reason=f"answered {answer!r} after {tools_used} tool results")
    return row
