"""A single-turn QA eval fed by a JSONL ``input_dataset`` through a ``dataset_adapter``, cut by ``max_dataset_rows``;
and one reading two files as two parametrizations (``combine_datasets=False``)."""

from pathlib import Path
from typing import Any

from eval_protocol.models import EvaluateResult, EvaluationRow, InputMetadata, Message
from eval_protocol.pytest import SingleTurnRolloutProcessor, evaluation_test

DATA = Path(__file__).parent / "data"
QA = str(DATA / "inputs_qa.jsonl")
QA_EXTRA = str(DATA / "inputs_qa_extra.jsonl")


def qa_adapter(records: list[dict[str, Any]]) -> list[EvaluationRow]:
    """One row per record: a system prompt and the question; the answer is the ground truth."""
    return [
        EvaluationRow(
            messages=[Message(role="system", content="Answer briefly."), Message(role="user", content=r["question"])],
            ground_truth=r["answer"],
            input_metadata=InputMetadata(row_id=r.get("id")),
        )
        for r in records
    ]


@evaluation_test(
    input_dataset=[QA],
    dataset_adapter=qa_adapter,
    max_dataset_rows=3,
    completion_params=[{"model": "tiny-qa", "temperature": 0.0}],
    rollout_processor=SingleTurnRolloutProcessor(),
    mode="pointwise",
)
def test_qa_dataset(row: EvaluationRow) -> EvaluationRow:
    """1.0 when the assistant's reply is exactly the ground truth."""
    return score_exact(row)


@evaluation_test(
    input_dataset=[QA, QA_EXTRA],
    dataset_adapter=qa_adapter,
    combine_datasets=False,
    max_dataset_rows=2,
    completion_params=[{"model": "tiny-qa"}],
    rollout_processor=SingleTurnRolloutProcessor(),
    mode="pointwise",
)
def test_qa_two_datasets(row: EvaluationRow) -> EvaluationRow:
    """1.0 when the assistant's reply is exactly the ground truth."""
    return score_exact(row)


def score_exact(row: EvaluationRow) -> EvaluationRow:
    last = row.messages[-1]
    reply = str(last.content or "").strip() if last.role == "assistant" else ""
    exact = reply == str(row.ground_truth)
    row.evaluation_result = EvaluateResult(score=float(exact), reason=f"reply {reply!r}", is_score_valid=True)
    return row
