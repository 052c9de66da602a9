"""An eval-protocol eval of sentiment labels in one word: is a short review positive or negative? It is the eval
``recipes/sentiment/smollm2.py`` trains a real pretrained model on.

Each row (``sentiment_reviews.jsonl``: 120 short reviews, half of them positive) asks the question as the only
message (the model's chat template adds its own system message) and tells the model to answer with one word. The body
scores the reply against the review's label: the right label, and no other, scores one over the reply's number of
words (1.0 for "Negative.", 0.25 for "This review is negative."); the wrong label, both labels or neither score 0.

SmolLM2-135M-Instruct tells the labels apart in a sentence ("This review is negative. It criticizes ...") but rarely
answers with the label alone, so it has room to improve from the eval's reward alone. Why one over the words, not a
flat score for any right reply that is too long: with a flat score every sentence ties, so a policy that answers in
sentences has no reward pulling it towards the asked-for word (measured: one seed of two rested there). Answering one
label everywhere in one word scores 0.5, so the held-out replies and the body's reasons are kept with every run
(``result.json``) to tell that apart from a policy that learned the labels.

Run it as an eval against any OpenAI-compatible server (a ``vllm serve`` of the model, or ``ep-trl serve
DIR``)::

    HOSTED_VLLM_API_BASE=http://127.0.0.1:8000/v1 pytest evals/eval_sentiment.py \\
        --ep-input-param model=hosted_vllm/MODEL
"""

import re
from pathlib import Path
from typing import Any

from eval_protocol.models import EvaluateResult, EvaluationRow, InputMetadata, Message
from eval_protocol.pytest import SingleTurnRolloutProcessor, evaluation_test

DATASET = str(Path(__file__).with_name("sentiment_reviews.jsonl"))
LABELS = ("positive", "negative")


def reviews_adapter(records: list[dict[str, Any]]) -> list[EvaluationRow]:
    """One row per review: the question as the only message; the label as the ground truth."""
    return [
        EvaluationRow(
            messages=[
                Message(
                    role="user",
                    content=f'Review: "{r["review"]}" Is this review positive or negative? Answer with one word.',
                )
            ],
            ground_truth=r["label"],
            input_metadata=InputMetadata(row_id=r["id"]),
        )
        for r in records
    ]


def label_score(reply: str, label: str) -> tuple[float, str]:
    """The score of one reply and why."""
    words = re.findall(r"[a-z]+", reply.lower())
    named = {word for word in words if word in LABELS}
    if not named:
        return 0.0, "names no label"
    if len(named) > 1:
        return 0.0, "names both labels"
    if named != {label}:
        return 0.0, f"wrong label (the review is {label})"
    if len(words) == 1:
        return 1.0, "the right label, in one word"
    return 1.0 / len(words), f"the right label, in {len(words)} words rather than one"


@evaluation_test(
    input_dataset=[DATASET],
    dataset_adapter=reviews_adapter,
    completion_params=[{"model": "smollm2-135m-instruct", "temperature": 0.0, "max_tokens": 24}],
    rollout_processor=SingleTurnRolloutProcessor(),
    mode="pointwise",
    passed_threshold=0.0,
)
def test_sentiment(row: EvaluationRow) -> EvaluationRow:
    """The right label scores one over the reply's words (1.0 in one word); the wrong label, both or neither 0."""
    last = row.messages[-1]
    reply = str(last.content or "") if last.role == "assistant" else ""
    score, why = label_score(reply, str(row.ground_truth))
    row.evaluation_result = EvaluateResult(score=score, reason=f"{why}: {reply!r}", is_score_valid=True)
    return row
