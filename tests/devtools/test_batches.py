"""Training rows interleaved by ground truth, so every batch of a classification eval holds each label as often."""

import json
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from ep_trl import ConfigError, dataset_from_eval
from ep_trl.devtools.batches import interleave_by_ground_truth

if TYPE_CHECKING:
    from datasets import Dataset

ROOT = Path(__file__).resolve().parents[2]
SENTIMENT = str(ROOT / "evals" / "eval_sentiment.py") + "::test_sentiment"
LETTERS = str(ROOT / "evals" / "eval_letters.py") + "::test_letters"


def _labels(dataset: "Dataset") -> list[str]:
    """The label of each prompt, read from the eval's data file by the row id in the prompt's row key."""
    by_id: dict[str, str] = {}
    for line in (ROOT / "evals" / "sentiment_reviews.jsonl").read_text().splitlines():
        record = json.loads(line)
        by_id[record["id"]] = record["label"]
    return [by_id[prompt[0]["ep_trl_row"].split(":", 1)[1]] for prompt in dataset["prompt"]]


def test_every_pair_of_rows_holds_both_labels_and_the_seed_orders_them() -> None:
    rows = dataset_from_eval(SENTIMENT).train_test_split(test_size=0.3, seed=0)["train"]
    labels = _labels(rows)
    assert any(labels[i] == labels[i + 1] for i in range(0, len(labels) - 1, 2))  # shuffled rows are not paired
    ordered = interleave_by_ground_truth(rows, SENTIMENT, seed=0)
    paired = _labels(ordered)
    balanced = 2 * min(paired.count("positive"), paired.count("negative"))
    assert all(set(paired[i : i + 2]) == {"positive", "negative"} for i in range(0, balanced, 2))
    assert sorted(map(json.dumps, ordered["prompt"])) == sorted(map(json.dumps, rows["prompt"]))  # same rows
    again = interleave_by_ground_truth(rows, SENTIMENT, seed=0)["prompt"]
    other = interleave_by_ground_truth(rows, SENTIMENT, seed=1)["prompt"]
    assert again == ordered["prompt"] and other != ordered["prompt"]


def test_an_eval_with_one_ground_truth_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match=r"eval_letters.py::test_letters: .* 1 distinct ground truth"):
        interleave_by_ground_truth(dataset_from_eval(LETTERS), LETTERS)
