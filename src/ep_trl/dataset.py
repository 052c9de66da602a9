"""The eval's own dataset as a TRL training dataset, so training prompts come from the same place as the eval's."""

from typing import Any

from . import evalprotocol
from .evalprotocol import resolve_eval_test


def dataset_from_eval(env_path: str, *, repeat: int = 1) -> Any:
    """A ``datasets.Dataset`` with a conversational ``prompt`` column holding the eval's input rows.

    ``repeat`` concatenates that many copies (an eval often has a single row that stands for "play one episode";
    each copy is one prompt group of ``num_generations`` episodes per step).
    """
    from datasets import Dataset

    if repeat < 1:
        raise ValueError(f"repeat must be >= 1, got {repeat}")
    rows = evalprotocol.dataset_messages(resolve_eval_test(env_path))
    return Dataset.from_dict({"prompt": [messages for _ in range(repeat) for messages in rows]})
