"""A single-turn QA eval fed by a ``DynamicDataLoader`` with two generators and a ``preprocess_fn``; and one that
also sets ``preprocess_fn`` on the decorator (eval-protocol rejects that when the eval runs)."""

from eval_protocol.data_loader import DynamicDataLoader
from eval_protocol.models import EvaluateResult, EvaluationRow, Message
from eval_protocol.pytest import SingleTurnRolloutProcessor, evaluation_test


def arithmetic_rows() -> list[EvaluationRow]:
    """Two sums."""
    return [
        EvaluationRow(messages=[Message(role="user", content="What is 1 + 1?")], ground_truth="2"),
        EvaluationRow(messages=[Message(role="user", content="What is 5 + 5?")], ground_truth="10"),
    ]


def geography_rows() -> list[EvaluationRow]:
    """Three capitals."""
    return [
        EvaluationRow(messages=[Message(role="user", content="Capital of Spain?")], ground_truth="Madrid"),
        EvaluationRow(messages=[Message(role="user", content="Capital of Japan?")], ground_truth="Tokyo"),
        EvaluationRow(messages=[Message(role="user", content="Capital of Peru?")], ground_truth="Lima"),
    ]


def add_system_prompt(rows: list[EvaluationRow]) -> list[EvaluationRow]:
    for row in rows:
        row.messages.insert(0, Message(role="system", content="Reply with one word."))
    return rows


@evaluation_test(
    data_loaders=DynamicDataLoader(generators=[arithmetic_rows, geography_rows], preprocess_fn=add_system_prompt),
    max_dataset_rows=5,
    completion_params=[{"model": "tiny-qa", "temperature": 0.0}],
    rollout_processor=SingleTurnRolloutProcessor(),
    mode="pointwise",
)
def test_qa_loader(row: EvaluationRow) -> EvaluationRow:
    """1.0 when the assistant's reply is exactly the ground truth."""
    return score_exact(row)


@evaluation_test(
    data_loaders=DynamicDataLoader(generators=[arithmetic_rows]),
    preprocess_fn=add_system_prompt,
    completion_params=[{"model": "tiny-qa"}],
    rollout_processor=SingleTurnRolloutProcessor(),
    mode="pointwise",
)
def test_qa_loader_top_level_preprocess(row: EvaluationRow) -> EvaluationRow:
    """1.0 when the assistant's reply is exactly the ground truth."""
    return score_exact(row)


def score_exact(row: EvaluationRow) -> EvaluationRow:
    last = row.messages[-1]
    reply = str(last.content or "").strip() if last.role == "assistant" else ""
    exact = reply == str(row.ground_truth)
    row.evaluation_result = EvaluateResult(score=float(exact), reason=f"reply {reply!r}", is_score_valid=True)
    return row
