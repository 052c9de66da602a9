"""Single-turn QA evals fed by ``input_messages``: one list of rows, and two lists (two parametrizations)."""

from eval_protocol.models import EvaluateResult, EvaluationRow, Message
from eval_protocol.pytest import SingleTurnRolloutProcessor, evaluation_test

SYSTEM = Message(role="system", content="Answer with a single word.")


@evaluation_test(
    input_messages=[
        [
            [SYSTEM, Message(role="user", content="What is the capital of France?")],
            [Message(role="user", content="What is 3 + 4?")],
            [SYSTEM, Message(role="user", content="What is the capital of France?")],
        ]
    ],
    completion_params=[{"model": "tiny-qa", "temperature": 0.0}],
    rollout_processor=SingleTurnRolloutProcessor(),
    mode="pointwise",
)
def test_qa_messages(row: EvaluationRow) -> EvaluationRow:
    """1.0 when the assistant's reply is exactly the ground truth (there is none here: always 0.0)."""
    return score_exact(row)


@evaluation_test(
    input_messages=[
        [[Message(role="user", content="Name a primary colour.")], [Message(role="user", content="Name a fruit.")]],
        [[Message(role="user", content="Name an ocean.")]],
    ],
    completion_params=[{"model": "tiny-qa"}],
    rollout_processor=SingleTurnRolloutProcessor(),
    max_dataset_rows=1,
    mode="pointwise",
)
def test_qa_two_message_lists(row: EvaluationRow) -> EvaluationRow:
    """1.0 when the assistant's reply is exactly the ground truth."""
    return score_exact(row)


def score_exact(row: EvaluationRow) -> EvaluationRow:
    last = row.messages[-1]
    reply = str(last.content or "").strip() if last.role == "assistant" else ""
    exact = row.ground_truth is not None and reply == str(row.ground_truth)
    row.evaluation_result = EvaluateResult(score=float(exact), reason=f"reply {reply!r}", is_score_valid=True)
    return row
