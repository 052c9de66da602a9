"""The eval's own input rows, read the way ``@evaluation_test`` reads them, and the key that maps prompts back.

TRL hands ``rollout_func`` only the dataset's ``prompt`` column, but a rollout needs the whole ``EvaluationRow``
(ground truth, tools, metadata). :func:`training_prompts` therefore writes a row key (``ROW_KEY``: the row's
position in :func:`eval_rows` and its eval-protocol ``row_id``) into the first message of every prompt, and
:func:`match_rows` turns each prompt back into its row: by that key, or, for prompts built by hand, by content.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ConfigError, EnvPathError, UnsupportedEvalError
from ..trajectory.content import content_text
from ..trajectory.types import JSONObject, Message, Messages, MessagesView, MessageView, Prompt, Row
from ._private import private_name
from .resolve import EvalTest, eval_file

if TYPE_CHECKING:  # eval-protocol's names, for the checker only (eval-protocol ships no types: they document)
    from eval_protocol.data_loader.models import EvaluationDataLoader
    from eval_protocol.models import Message as EvalMessage
    from eval_protocol.pytest.generate_parameter_combinations import CombinationTuple

logger = logging.getLogger(__name__)

#: The key, in the first message of each training prompt, naming the eval row the prompt came from.
ROW_KEY = "ep_trl_row"

#: Fields that differ between otherwise identical rows (as eval-protocol's own row hash excludes them).
_VOLATILE_FIELDS = {"created_at", "execution_metadata", "pid"}

_noted_combined: set[str] = set()


def eval_rows(eval_test: EvalTest, input_dataset: Sequence[str] | None = None) -> list[Row]:
    """The rows ``@evaluation_test`` would hand the eval's processor, in order, with their ``row_id`` set.

    Each parametrization of the inputs (eval-protocol's own ``generate_parameter_combinations``) is read as one
    pytest invocation reads it: ``data_loaders`` (``load()``, every variant, then ``max_dataset_rows``),
    ``input_dataset`` (``load_jsonl``, ``max_dataset_rows``, ``dataset_adapter``), ``input_messages`` (one row
    per message list) or ``input_rows`` (deep copies); then ``filtered_row_ids``, ``preprocess_fn`` and
    eval-protocol's stable ``row_id`` for rows without one. Several parametrizations (several message lists,
    dataset paths with ``combine_datasets=False``, several loaders) are concatenated in order, and logged once.

    ``input_dataset``: JSONL files read in place of the eval's own ``input_dataset``, exactly as it would be read
    (its ``dataset_adapter``, ``max_dataset_rows``, ``combine_datasets``, ...); an eval without an ``input_dataset``
    of its own has no adapter for such files, and is refused (:func:`check_input_dataset`).
    """
    if input_dataset is not None:
        check_input_dataset(eval_test, input_dataset)
    combinations = _input_combinations(eval_test, input_dataset)
    if len(combinations) > 1 and eval_test.qualified_name not in _noted_combined:
        _noted_combined.add(eval_test.qualified_name)
        logger.warning(
            "%s parametrizes its inputs %d ways; ep_trl trains on all of their rows together, "
            "in order (pytest would run them as %d separate experiments).",
            eval_test.qualified_name,
            len(combinations),
            len(combinations),
        )
    rows = [row for combination in combinations for row in _read_invocation(eval_test, combination)]
    _check_rows(eval_test, rows)
    return rows


def row_key(index: int, row: Row) -> str:
    """The key of the row at ``index`` in :func:`eval_rows`; identical rows share a ``row_id``, not a position."""
    return f"{index}:{row.input_metadata.row_id}"


def training_prompts(eval_test: EvalTest, input_dataset: Sequence[str] | None = None) -> list[Messages]:
    """One conversational prompt per eval row (``input_dataset``: as :func:`eval_rows`): its messages as chat dicts,
    the first carrying ``ROW_KEY``."""
    prompts = []
    for index, row in enumerate(eval_rows(eval_test, input_dataset)):
        messages = [_message_dict(message) for message in row.messages]
        messages[0][ROW_KEY] = row_key(index, row)
        prompts.append(messages)
    return prompts


def strip_row_key(messages: MessagesView) -> Messages:
    """``messages`` as plain chat dicts: no ``ROW_KEY`` and no None-valued keys (a datasets round trip adds them)."""
    return [{k: v for k, v in message.items() if k != ROW_KEY and v is not None} for message in messages]


def initial_messages(prompt: object, index: int = 0) -> tuple[Message, ...]:
    """TRL hands over the dataset's prompt column: a string or a list of chat messages."""
    shape = (
        "the dataset's 'prompt' column must hold strings or lists of messages such as "
        "[{'role': 'user', 'content': 'Play the game.'}]"
    )
    if isinstance(prompt, str):
        return ({"role": "user", "content": prompt},)
    if not isinstance(prompt, Sequence) or not all(isinstance(m, Mapping) for m in prompt):
        raise TypeError(f"rollout_func got prompt {index} of type {type(prompt).__name__}; {shape}")
    messages = strip_row_key(prompt)  # dataset_from_eval's row key, and the None keys a datasets column adds
    for k, message in enumerate(messages):
        content = message.get("content")
        if not isinstance(message.get("role"), str) or not isinstance(content, (str, list, tuple)):
            raise ConfigError(
                f"prompt {index}, message {k} is {dict(message)!r}: every message needs a 'role' and a "
                f"'content' (a string or content parts); {shape}"
            )
    return tuple(dict(m) for m in messages)


def match_rows(prompts: Sequence[Prompt], rows: Sequence[Row], eval_name: str) -> list[Row]:
    """The eval row behind each TRL prompt, as a deep copy per prompt (each rollout mutates its own).

    A prompt whose first message carries ``ROW_KEY`` names its row directly. Every other prompt (built by hand,
    or a plain string) is matched by the role and text of every message; it must match rows that all hold the
    same data, else the prompt cannot say which ground truth or metadata it stands for.
    """
    return [row.model_copy(deep=True) for row in _matching_rows(prompts, rows, eval_name)]


def check_rows(prompts: Sequence[Prompt], rows: Sequence[Row], eval_name: str) -> None:
    """Raise as :func:`match_rows` would for a prompt that stands for no single row, without copying any row."""
    _matching_rows(prompts, rows, eval_name)


def _matching_rows(prompts: Sequence[Prompt], rows: Sequence[Row], eval_name: str) -> list[Row]:
    by_content: dict[tuple[tuple[str, str], ...], list[int]] | None = None
    matched = []
    for n, prompt in enumerate(prompts):
        messages = _prompt_messages(prompt)
        key = messages[0].get(ROW_KEY) if messages else None
        if key is not None:
            matched.append(_row_by_key(key, rows, eval_name))
        else:
            if by_content is None:
                by_content = _content_index(rows)
            matched.append(_row_by_content(n, messages, rows, by_content.get(_content_key(messages), []), eval_name))
    return matched


def check_input_dataset(eval_test: EvalTest, paths: Sequence[str]) -> None:
    """Raise unless ``paths`` can stand in for the eval's ``input_dataset``: the eval reads an ``input_dataset``
    through its ``dataset_adapter`` (not inline rows, messages or data loaders), and every path is a file."""
    params = eval_test.wrapper.__ep_params__
    if params.input_dataset is None or params.data_loaders is not None:
        given = (
            "data_loaders"
            if params.data_loaders is not None
            else "input_rows"
            if params.input_rows is not None
            else "input_messages"
            if params.input_messages is not None
            else "no input"
        )
        raise UnsupportedEvalError(
            f"{eval_test.qualified_name} reads its rows from {given}, not from an input_dataset with a "
            "dataset_adapter, so nothing here says how JSONL rows become its EvaluationRows. Drop the input dataset "
            "(training uses the eval's own rows), or give the eval input_dataset=[...] and the dataset_adapter that "
            "reads your rows."
        )
    if not paths:
        raise ConfigError("the input dataset names no file: give one or more JSONL files of the eval's rows.")
    missing = [path for path in paths if not Path(path).expanduser().is_file()]
    if missing:
        raise ConfigError(
            f"input dataset {', '.join(map(repr, missing))}: no such file (from {Path.cwd()}). Give JSONL files of "
            f"rows in the format {eval_test.qualified_name}'s dataset_adapter reads."
        )


def _input_combinations(eval_test: EvalTest, input_dataset: Sequence[str] | None = None) -> list[CombinationTuple]:
    """The eval's input parametrizations, as eval-protocol builds them for pytest (one completion-params slot),
    ``input_dataset`` in place of the eval's own when given."""
    params = eval_test.wrapper.__ep_params__
    generate = private_name("eval_protocol.pytest.generate_parameter_combinations", "generate_parameter_combinations")
    dataset = list(input_dataset) if input_dataset is not None else params.input_dataset
    try:
        return generate(
            dataset,
            [None],
            params.input_messages,
            params.input_rows,
            None,
            params.max_dataset_rows,
            params.combine_datasets,
            params.data_loaders,
        )
    except ValueError as exc:
        raise _no_rows(eval_test, f"eval-protocol finds no input in it ({exc})") from exc


def _read_invocation(eval_test: EvalTest, combination: CombinationTuple) -> list[Row]:
    """The rows one pytest invocation of the eval reads (``evaluation_test``'s ``wrapper_body``)."""
    params = eval_test.wrapper.__ep_params__
    dataset_paths, _, input_messages, input_rows, _, data_loaders = combination
    if data_loaders is not None:
        if params.preprocess_fn is not None:
            raise UnsupportedEvalError(
                f"{eval_test.qualified_name} sets preprocess_fn together with data_loaders, which eval-protocol "
                "rejects as well; pass preprocess_fn to the data loader instead."
            )
        rows = _from_loaders(data_loaders, params.max_dataset_rows)
    elif dataset_paths is not None:
        rows = _from_dataset(eval_test, dataset_paths)
    elif input_messages is not None:
        from eval_protocol.models import EvaluationRow

        rows = [EvaluationRow(messages=messages) for messages in input_messages]
    else:
        rows = [row.model_copy(deep=True) for row in input_rows or []]
    if params.filtered_row_ids is not None:
        rows = [row for row in rows if row.input_metadata.row_id in params.filtered_row_ids]
    if params.preprocess_fn is not None:
        # evaluation_test 0.3.33 means to apply it here, but its pytest path raises UnboundLocalError first.
        rows = params.preprocess_fn(rows)
    for row in rows:
        _ensure_row_id(row)
    return rows


def _from_loaders(
    data_loaders: EvaluationDataLoader | Sequence[EvaluationDataLoader], max_rows: int | None
) -> list[Row]:
    from eval_protocol.data_loader.models import EvaluationDataLoader

    loaders = [data_loaders] if isinstance(data_loaders, EvaluationDataLoader) else data_loaders
    rows = [row for loader in loaders for result in loader.load() for row in result.rows]
    return rows[:max_rows] if max_rows is not None else rows


def _from_dataset(eval_test: EvalTest, paths: Sequence[str]) -> list[Row]:
    from eval_protocol.common_utils import load_jsonl

    params = eval_test.wrapper.__ep_params__
    records: list[JSONObject] = []
    for given in paths:
        path = _dataset_path(eval_test, given)
        try:
            records.extend(load_jsonl(path))
        except OSError as exc:
            raise UnsupportedEvalError(
                f"{eval_test.qualified_name}: cannot read its input_dataset {path!r} ({type(exc).__name__}: {exc}). "
                "eval-protocol reads relative paths from the current directory: start training from the directory "
                "you run the eval's pytest from, or make the path absolute."
            ) from exc
    if params.max_dataset_rows is not None:
        records = records[: params.max_dataset_rows]
    return params.dataset_adapter(records)


def _dataset_path(eval_test: EvalTest, given: str) -> str:
    """A dataset path as eval-protocol would read it, a relative one that the working directory lacks found beside
    the eval's package (``resolve.eval_file``; logged)."""
    if given.startswith(("http://", "https://")):  # eval-protocol's load_jsonl fetches URLs
        return given
    try:
        found = eval_file(eval_test, given, "input_dataset")
    except EnvPathError as exc:
        raise UnsupportedEvalError(
            f"{exc} Or train on rows of your own: ep-trl train --input-dataset FILE.jsonl "
            "(dataset_from_eval(..., input_dataset=[...]) and EvalOverrides(input_dataset=[...]) "
            "in Python)."
        ) from exc
    if found.note:
        logger.info("%s", found.note)
    return found.path


def _ensure_row_id(row: Row) -> None:
    """eval-protocol's rule for a row without ``row_id``: a stable id from the row's hash."""
    from eval_protocol.human_id import generate_id, num_combinations

    if row.input_metadata.row_id is None:
        row.input_metadata.row_id = generate_id(seed=0, index=abs(hash(row)) % num_combinations())


def _check_rows(eval_test: EvalTest, rows: Sequence[Row]) -> None:
    if not rows:
        raise _no_rows(eval_test, "its inputs yield no rows")
    empty = [row.input_metadata.row_id for row in rows if not row.messages]
    if empty:
        raise _no_rows(eval_test, f"rows {', '.join(map(str, empty[:5]))} have no messages to prompt with")


def _no_rows(eval_test: EvalTest, why: str) -> UnsupportedEvalError:
    return UnsupportedEvalError(
        f"{eval_test.qualified_name} gives no training prompts: {why}. Build the training dataset yourself, "
        "with a 'prompt' column of chat messages."
    )


def _message_dict(message: EvalMessage) -> Message:
    return message.model_dump(include={"role", "content", "name", "tool_calls", "tool_call_id"}, exclude_none=True)


def _prompt_messages(prompt: Prompt) -> list[MessageView]:
    """A TRL prompt as messages: a plain string is one user message."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    return list(prompt)


def _row_by_key(key: object, rows: Sequence[Row], eval_name: str) -> Row:
    index, _, row_id = str(key).partition(":")
    row = rows[int(index)] if index.isdigit() and int(index) < len(rows) else None
    if row is None or row.input_metadata.row_id != row_id:
        raise ConfigError(
            f"A training prompt carries row key {key!r}, which names no row of {eval_name} as it reads now "
            f"({len(rows)} rows): the dataset was built from another version of the eval's data. Rebuild it with "
            "ep_trl.dataset_from_eval(env_path)."
        )
    return row


def _content_key(messages: Sequence[MessageView | EvalMessage]) -> tuple[tuple[str, str], ...]:
    def field(message: MessageView | EvalMessage, name: str) -> object:
        return message.get(name) if isinstance(message, Mapping) else getattr(message, name, None)

    return tuple((str(field(m, "role")), content_text(field(m, "content"))) for m in messages)


def _content_index(rows: Sequence[Row]) -> dict[tuple[tuple[str, str], ...], list[int]]:
    index: dict[tuple[tuple[str, str], ...], list[int]] = {}
    for i, row in enumerate(rows):
        index.setdefault(_content_key(row.messages), []).append(i)
    return index


def _row_data(row: Row) -> JSONObject:
    """What a rollout and the eval body can see of a row, less its id and eval-protocol's loader bookkeeping."""
    data = row.model_dump(exclude=_VOLATILE_FIELDS)
    data["input_metadata"].pop("row_id", None)
    info = data["input_metadata"].get("dataset_info") or {}
    data["input_metadata"]["dataset_info"] = {k: v for k, v in info.items() if not k.startswith("data_loader_")}
    return data


def _row_by_content(n: int, messages: MessagesView, rows: Sequence[Row], candidates: list[int], eval_name: str) -> Row:
    if not candidates:
        text = " | ".join(content_text(m.get("content")) for m in messages)
        preview = text[:80] + ("..." if len(text) > 80 else "")
        raise ConfigError(
            f"prompt {n} ({preview!r}) matches no row of {eval_name}; build the training dataset with "
            "ep_trl.dataset_from_eval(env_path)."
        )
    first = rows[candidates[0]]
    if any(_row_data(rows[i]) != _row_data(first) for i in candidates[1:]):
        ids = ", ".join(f"{i}:{rows[i].input_metadata.row_id}" for i in candidates)
        raise ConfigError(
            f"prompt {n} has the messages of several rows of {eval_name} that differ in other data (ground truth, "
            f"tools or metadata): rows {ids}. Build the training dataset with ep_trl.dataset_from_eval(env_path) "
            f"so each prompt carries its row key ({ROW_KEY!r} in its first message)."
        )
    return first
