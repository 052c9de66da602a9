"""An eval-protocol eval of a length constraint, in the manner of IFEval's "answer in at most N words": describe a
topic in at most five words. It is the eval ``train_smollm2_trl.py`` trains a real pretrained model on.

Each row (``topics.jsonl``, 126 everyday topics) asks "Describe {topic} in at most five words." as the only message
(the model's chat template adds its own system message). The body scores a reply that names the topic and describes
it (at least two other words, filler such as "is" and "the" aside) 1.0 when it has at most five words and 5/n for n
words; a reply that does not name the topic, or only names it, scores 0. SmolLM2-135M-Instruct
starts with full sentences (about 0.3: "An apple is a sweet, juicy fruit that is often ..."), so it has room to improve
from the eval's reward alone, and what it learns (keep it short, name the topic) carries over to topics it never
trained on.

Run it as an eval against any OpenAI-compatible server (a ``vllm serve`` of the model, or ``python -m ep_trl.serve
DIR``)::

    HOSTED_VLLM_API_BASE=http://127.0.0.1:8000/v1 pytest examples/brevity/eval_brevity.py \
        --ep-input-param model=hosted_vllm/MODEL
"""

import re
from pathlib import Path
from typing import Any

from eval_protocol.models import EvaluateResult, EvaluationRow, InputMetadata, Message
from eval_protocol.pytest import SingleTurnRolloutProcessor, evaluation_test

DATASET = str(Path(__file__).with_name("topics.jsonl"))
MAX_WORDS = 5


def topics_adapter(records: list[dict[str, Any]]) -> list[EvaluationRow]:
    """One row per topic: the request as the only message; the topic as the ground truth."""
    return [
        EvaluationRow(
            messages=[Message(role="user", content=f"Describe {r['topic']} in at most five words.")],
            ground_truth=r["topic"],
            input_metadata=InputMetadata(row_id=r["id"]),
        )
        for r in records
    ]


#: Words that say nothing about the topic (a description needs two words besides these and the topic).
FILLER = frozenset("a an the is are was be of and or in on it its this that to with for as very".split())


def brevity_score(reply: str, topic: str) -> tuple[float, str]:
    """The score of one reply and why."""
    words = re.findall(r"[A-Za-z0-9']+", reply)
    named = [word.lower().startswith(topic.lower()) for word in words]
    if not any(named):
        return 0.0, f"does not name {topic!r}"
    described = [w for w, is_topic in zip(words, named) if not is_topic and w.lower() not in FILLER]
    if len(described) < 2:
        return 0.0, "names the topic but does not describe it (fewer than two other words)"
    if len(words) <= MAX_WORDS:
        return 1.0, f"{len(words)} words"
    return MAX_WORDS / len(words), f"{len(words)} words, more than {MAX_WORDS}"


@evaluation_test(
    input_dataset=[DATASET],
    dataset_adapter=topics_adapter,
    completion_params=[{"model": "smollm2-135m-instruct", "temperature": 0.0, "max_tokens": 24}],
    rollout_processor=SingleTurnRolloutProcessor(),
    mode="pointwise",
    passed_threshold=0.0,
)
def test_brevity(row: EvaluationRow) -> EvaluationRow:
    """1.0 for a reply of at most five words that names and describes the topic, 5/n for n words, else 0."""
    last = row.messages[-1]
    reply = str(last.content or "") if last.role == "assistant" else ""
    score, why = brevity_score(reply, str(row.ground_truth))
    row.evaluation_result = EvaluateResult(score=score, reason=f"{why}: {reply!r}", is_score_valid=True)
    return row
