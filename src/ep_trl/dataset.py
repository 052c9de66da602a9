"""The eval's own dataset as a TRL training dataset, so training prompts come from the same place as the eval's."""

from collections.abc import Sequence
from typing import TYPE_CHECKING

from . import evalprotocol
from .evalprotocol import resolve_eval_test

if TYPE_CHECKING:
    from datasets import Dataset


def dataset_from_eval(env_path: str, *, repeat: int = 1, input_dataset: Sequence[str] | None = None) -> "Dataset":
    """A ``datasets.Dataset`` with a conversational ``prompt`` column: one prompt per input row of the eval.

    The rows are the eval's own ``EvaluationRow``s, read the way ``@evaluation_test`` reads them (``input_messages``,
    ``input_rows``, ``input_dataset`` + ``dataset_adapter``, ``data_loaders``, with ``max_dataset_rows``,
    ``filtered_row_ids`` and ``preprocess_fn``); several parametrizations of the inputs are concatenated.

    TRL gives ``rollout_func`` only this ``prompt`` column, so the first message of each prompt carries the row key
    ``"ep_trl_row": "<position>:<row_id>"`` (the row's position among the eval's rows, and its eval-protocol row id).
    The rollout function maps each prompt back to its full row (ground truth, tools, metadata) through that key,
    and fails with a ``ConfigError`` when the eval's data changed since the dataset was built. The key is stripped
    before the messages reach the model.

    A dataset built by hand (prompts without the key, or plain strings) still works while every prompt's messages
    (role and text) match rows that hold the same data; a prompt matching no row, or rows that differ in ground
    truth, tools or metadata, is a ``ConfigError`` asking for this function.

    ``repeat`` concatenates that many copies (an eval often has a single row that stands for "play one episode";
    each copy is one prompt group of ``num_generations`` episodes per step).

    ``input_dataset``: JSONL files read in place of the eval's own ``input_dataset``, through its ``dataset_adapter``
    (``EvalOverrides(input_dataset=...)`` must name the same files, so that each prompt's row key finds its row).
    """
    from datasets import Dataset

    if repeat < 1:
        raise ValueError(f"repeat must be >= 1, got {repeat}")
    prompts = evalprotocol.training_prompts(resolve_eval_test(env_path), input_dataset)
    return Dataset.from_dict({"prompt": [messages for _ in range(repeat) for messages in prompts]})
