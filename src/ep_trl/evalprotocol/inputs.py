"""The eval's own input rows (``input_messages``, ``input_rows`` or ``input_dataset`` + ``dataset_adapter``)."""

from collections.abc import Mapping
from typing import Any

from ..errors import UnsupportedEvalError
from .resolve import EvalTest


def dataset_messages(eval_test: EvalTest) -> list[list[dict[str, Any]]]:
    """The eval's own dataset as chat messages, one list per row, from the first of its parametrized inputs."""
    params = eval_test.wrapper.__ep_params__
    if params.input_messages:
        rows = [list(messages) for messages in params.input_messages[0]]
    elif params.input_rows:
        rows = [list(row.messages) for row in params.input_rows[0]]
    elif params.input_dataset:
        from eval_protocol.common_utils import load_jsonl

        records: list[dict[str, Any]] = []
        paths = params.input_dataset if isinstance(params.input_dataset, (list, tuple)) else [params.input_dataset]
        for path in paths:
            records.extend(load_jsonl(path))
        rows = [list(row.messages) for row in params.dataset_adapter(records)]
    else:
        raise UnsupportedEvalError(
            f"{eval_test.qualified_name} has no input_messages, input_rows or input_dataset (data_loaders are not "
            "read by ep_trl); build the training dataset yourself with a 'prompt' column of messages."
        )
    if params.max_dataset_rows:
        rows = rows[: params.max_dataset_rows]
    return [[_message_dict(m) for m in messages] for messages in rows]


def _message_dict(message: Any) -> dict[str, Any]:
    if isinstance(message, Mapping):
        return {"role": message["role"], "content": message.get("content", "")}
    return {"role": message.role, "content": message.content}
