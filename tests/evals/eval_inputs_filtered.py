"""A single-turn QA eval that keeps only some rows (``filtered_row_ids``); and one with a ``preprocess_fn``."""

from eval_protocol.models import EvaluateResult, EvaluationRow, InputMetadata, Message
from eval_protocol.pytest import SingleTurnRolloutProcessor, evaluation_test


def qa_row(question: str, answer: str, row_id: str | None) -> EvaluationRow:
    return EvaluationRow(
        messages=[Message(role="user", content=question)],
        ground_truth=answer,
        input_metadata=InputMetadata(row_id=row_id),
    )


ROWS = [
    qa_row("What is 9 - 4?", "5", "sub-1"),
    qa_row("What is 6 * 7?", "42", "mul-1"),
    qa_row("What is 8 / 2?", "4", "div-1"),
    qa_row("What is 1 + 2?", "3", None),
]


def only_questions_with_a_big_answer(rows: list[EvaluationRow]) -> list[EvaluationRow]:
    return [row for row in rows if int(row.ground_truth) >= 5]


@evaluation_test(
    input_rows=[ROWS],
    filtered_row_ids=["mul-1", "sub-1"],
    completion_params=[{"model": "tiny-qa", "temperature": 0.0}],
    rollout_processor=SingleTurnRolloutProcessor(),
    mode="pointwise",
)
def test_qa_filtered(row: EvaluationRow) -> EvaluationRow:
    """1.0 when the assistant's reply is exactly the ground truth."""
    return score_exact(row)


@evaluation_test(
    input_rows=[ROWS],
    preprocess_fn=only_questions_with_a_big_answer,
    completion_params=[{"model": "tiny-qa"}],
    rollout_processor=SingleTurnRolloutProcessor(),
    mode="pointwise",
)
def test_qa_preprocessed(row: EvaluationRow) -> EvaluationRow:
    """1.0 when the assistant's reply is exactly the ground truth."""
    return score_exact(row)


def score_exact(row: EvaluationRow) -> EvaluationRow:
    last = row.messages[-1]
    reply = str(last.content or "").strip() if last.role == "assistant" else ""
    exact = reply == str(row.ground_truth)
    row.evaluation_result = EvaluateResult(score=float(exact), reason=f"reply {reply!r}", is_score_valid=True)
    return row
