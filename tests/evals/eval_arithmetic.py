"""Arithmetic with exact-answer scoring, written the way eval-protocol's single-turn examples are."""

from eval_protocol.models import EvaluateResult, EvaluationRow, Message
from eval_protocol.pytest import SingleTurnRolloutProcessor, evaluation_test

SYSTEM = "Answer with the number only."
QUESTIONS = [("What is 2 + 3?", "5"), ("What is 7 - 4?", "3"), ("What is 3 * 3?", "9")]


@evaluation_test(
    input_rows=[
        [
            EvaluationRow(
                messages=[Message(role="system", content=SYSTEM), Message(role="user", content=q)], ground_truth=answer
            )
            for q, answer in QUESTIONS
        ]
    ],
    completion_params=[
        {"model": "fireworks_ai/accounts/fireworks/models/qwen3-8b", "temperature": 0.0, "max_tokens": 8}
    ],
    rollout_processor=SingleTurnRolloutProcessor(),
    mode="pointwise",
    passed_threshold=0.0,
)
def test_arithmetic(row: EvaluationRow) -> EvaluationRow:
    """1.0 when the reply is exactly the ground-truth number; otherwise partial credit for keeping to the number
    only, ``1 / (2 + characters that are not digits)``, so that wrong replies differ too (a reward that is the same
    for every reply of a group gives GRPO nothing to learn from)."""
    reply = (row.messages[-1].content or "").strip() if row.messages[-1].role == "assistant" else ""
    correct = reply == row.ground_truth
    score = 1.0 if correct else 1.0 / (2 + sum(not c.isdigit() for c in reply))
    row.evaluation_result = EvaluateResult(score=score, reason=f"replied {reply!r}")
    return row
