"""The eval's own rows, read as ``@evaluation_test`` reads them, and TRL prompts mapped back to them.

The reference for "what eval-protocol feeds the eval" is eval-protocol itself: :func:`rows_pytest_feeds` runs the
eval's own pytest wrapper (every parametrization pytest would collect) with the rollout processor replaced by a
recorder, and returns the rows eval-protocol handed it.
"""

import asyncio
import logging
import sys
from collections.abc import Coroutine
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Protocol, cast

import pytest
from datasets import Dataset
from eval_protocol.models import EPParameters, EvaluationRow, Message

from ep_trl import ConfigError, UnsupportedEvalError
from ep_trl.evalprotocol import (
    ROW_KEY,
    EvalTest,
    eval_rows,
    match_rows,
    resolve_eval_test,
    row_key,
    strip_row_key,
    training_prompts,
)
from ep_trl.evalprotocol import inputs as inputs_module
from ep_trl.evalprotocol.resolve import EvalWrapper

MESSAGES = "tests/evals/eval_inputs_messages.py"
ROWS = "tests/evals/eval_inputs_rows.py::test_qa_rows"
DATASET = "tests/evals/eval_inputs_dataset.py"
LOADER = "tests/evals/eval_inputs_loader.py"
FILTERED = "tests/evals/eval_inputs_filtered.py"


class PytestWrapper(EvalWrapper, Protocol):
    """An ``@evaluation_test`` wrapper as pytest runs it (``EvalWrapper`` declares only what ep_trl reads): its marks,
    and called with one parametrization's arguments."""

    pytestmark: list[pytest.Mark]

    def __call__(self, **kwargs: Any) -> Coroutine[Any, Any, Any]: ...


def rows_pytest_feeds(eval_test: EvalTest, monkeypatch: pytest.MonkeyPatch) -> list[EvaluationRow]:
    """The rows eval-protocol hands the eval's rollout processor, over every pytest parametrization, in order."""
    # not DISABLE_EP_SQLITE_LOG: eval-protocol's default logger reads it once per process (tests/conftest.py gives
    # the session a HOME of its own, so the rows pytest logs stay there)
    monkeypatch.setenv("EP_DISABLE_AUTO_BROWSER", "1")
    fed: list[EvaluationRow] = []

    def record(self: object, rows: list[EvaluationRow], config: object) -> "list[asyncio.Task[EvaluationRow]]":
        fed.extend(row.model_copy(deep=True) for row in rows)

        async def done(row: EvaluationRow) -> EvaluationRow:
            return row

        return [asyncio.create_task(done(row)) for row in rows]

    wrapper = cast(PytestWrapper, eval_test.wrapper)
    monkeypatch.setattr(type(wrapper.__ep_params__.rollout_processor), "__call__", record)
    [mark] = [m for m in wrapper.pytestmark if m.name == "parametrize"]
    for values in mark.kwargs["argvalues"]:
        asyncio.run(wrapper(**dict(zip(mark.kwargs["argnames"], values))))
    return fed


def summary(rows: list[EvaluationRow]) -> list[tuple]:
    return [(row.input_metadata.row_id, row.ground_truth, [(m.role, m.content) for m in row.messages]) for row in rows]


def resolve(env_path: str) -> EvalTest:
    return resolve_eval_test(env_path)


@pytest.mark.parametrize(
    "env_path",
    [
        f"{MESSAGES}::test_qa_messages",
        f"{MESSAGES}::test_qa_two_message_lists",
        ROWS,
        f"{DATASET}::test_qa_dataset",
        f"{DATASET}::test_qa_two_datasets",
        f"{LOADER}::test_qa_loader",
        f"{FILTERED}::test_qa_filtered",
    ],
)
def test_rows_are_what_eval_protocol_feeds_the_eval(env_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    eval_test = resolve(env_path)
    ours, fed = eval_rows(eval_test), rows_pytest_feeds(eval_test, monkeypatch)
    assert summary(ours) == summary(fed) and len(ours) >= 2
    assert [row.tools for row in ours] == [row.tools for row in fed]


def test_input_messages_rows() -> None:
    rows = eval_rows(resolve(f"{MESSAGES}::test_qa_messages"))
    france = [("system", "Answer with a single word."), ("user", "What is the capital of France?")]
    assert [[(m.role, m.content) for m in row.messages] for row in rows] == [
        france,
        [("user", "What is 3 + 4?")],
        france,
    ]
    # eval-protocol's stable id: identical rows share it.
    ids = [row.input_metadata.row_id for row in rows]
    assert ids[0] == ids[2] != ids[1] and all(ids)


def test_input_rows_keep_ground_truth_ids_and_tools() -> None:
    eval_test = resolve(ROWS)
    rows = eval_rows(eval_test)
    assert [row.ground_truth for row in rows] == ["4", "4", "Paris", "sunny", "3", "7"]
    assert rows[2].input_metadata.row_id == "capital-france"
    assert rows[0].input_metadata.row_id == rows[1].input_metadata.row_id
    assert rows[3].tools[0]["function"]["name"] == "weather"
    originals = sys.modules[eval_test.module_name].ROWS
    assert all(row is not original for row, original in zip(rows, originals)), "rows must be copies"
    assert originals[0].input_metadata.row_id is None, "the eval's own rows must stay untouched"


def test_input_dataset_goes_through_the_adapter_cut_to_max_rows() -> None:
    rows = eval_rows(resolve(f"{DATASET}::test_qa_dataset"))
    assert [(row.input_metadata.row_id, row.ground_truth) for row in rows][::2] == [("qa-1", "5"), ("qa-3", "8")]
    assert len(rows) == 3 and rows[1].ground_truth == "Rome" and rows[1].input_metadata.row_id
    assert [m.content for m in rows[0].messages] == ["Answer briefly.", "What is 2 + 3?"]


def test_several_parametrizations_are_concatenated_and_logged_once(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(inputs_module, "_noted_combined", set())
    eval_test = resolve(f"{DATASET}::test_qa_two_datasets")
    with caplog.at_level(logging.WARNING, logger="ep_trl.evalprotocol.inputs"):
        rows = eval_rows(eval_test)
        eval_rows(eval_test)
    assert [row.ground_truth for row in rows] == ["5", "Rome", "42", "Mars"]  # max_dataset_rows=2 per file
    notes = [r.getMessage() for r in caplog.records if "parametrizes its inputs 2 ways" in r.getMessage()]
    assert len(notes) == 1 and "test_qa_two_datasets" in notes[0]
    two_lists = eval_rows(resolve(f"{MESSAGES}::test_qa_two_message_lists"))
    assert [row.messages[0].content for row in two_lists] == ["Name a primary colour.", "Name an ocean."]


def test_data_loader_rows_are_what_load_returns(monkeypatch: pytest.MonkeyPatch) -> None:
    """DynamicDataLoader with two generators, preprocess_fn and max_dataset_rows=5.

    eval-protocol 0.3.33's DynamicDataLoader binds its generator late: both variants call the last generator, so
    pytest sees the geography rows twice and never the arithmetic ones. ep_trl reads ``load()`` as
    ``evaluation_test`` does and so sees the same; this test pins that, and fails when eval-protocol fixes it.
    """
    rows = eval_rows(resolve(f"{LOADER}::test_qa_loader"))
    assert [row.ground_truth for row in rows] == ["Madrid", "Tokyo", "Lima", "Madrid", "Tokyo"]
    assert all([m.role for m in row.messages] == ["system", "user"] for row in rows)  # preprocess_fn ran once
    assert rows[0].input_metadata.row_id == rows[3].input_metadata.row_id


def test_preprocess_fn_beside_data_loaders_is_rejected_like_eval_protocol_does(monkeypatch: pytest.MonkeyPatch) -> None:
    eval_test = resolve(f"{LOADER}::test_qa_loader_top_level_preprocess")
    with pytest.raises(UnsupportedEvalError, match="test_qa_loader_top_level_preprocess.*preprocess_fn.*data loader"):
        eval_rows(eval_test)
    with pytest.raises(ValueError, match="preprocess_fn should not be used with data_loaders"):
        rows_pytest_feeds(eval_test, monkeypatch)


def test_filtered_row_ids_keep_only_those_rows() -> None:
    rows = eval_rows(resolve(f"{FILTERED}::test_qa_filtered"))
    # filtered before ids are generated, as in eval-protocol: the row without a row_id is dropped.
    assert [(row.input_metadata.row_id, row.ground_truth) for row in rows] == [("sub-1", "5"), ("mul-1", "42")]


def test_preprocess_fn_is_applied(monkeypatch: pytest.MonkeyPatch) -> None:
    """eval-protocol 0.3.33's pytest path raises UnboundLocalError for any preprocess_fn without data_loaders
    (``data_loaders`` is a local of its wrapper body); ep_trl applies it as documented."""
    eval_test = resolve(f"{FILTERED}::test_qa_preprocessed")
    rows = eval_rows(eval_test)
    assert [(row.input_metadata.row_id, row.ground_truth) for row in rows] == [("sub-1", "5"), ("mul-1", "42")]
    with pytest.raises(UnboundLocalError):
        rows_pytest_feeds(eval_test, monkeypatch)


def fake_eval(**params: Any) -> EvalTest:
    return EvalTest(
        env_path="x",
        module_name="evals.fake",
        name="test_fake",
        wrapper=SimpleNamespace(__ep_params__=EPParameters(**params)),
    )


@pytest.mark.parametrize(
    ("params", "why"),
    [
        ({}, "finds no input"),
        ({"input_messages": [[]]}, "yield no rows"),
        ({"input_rows": [[EvaluationRow(messages=[])]]}, "have no messages"),
    ],
)
def test_no_prompts_is_an_error_saying_what_to_do(params: dict[str, Any], why: str) -> None:
    with pytest.raises(UnsupportedEvalError, match=rf"evals\.fake::test_fake.*{why}.*'prompt' column"):
        eval_rows(fake_eval(**params))


def test_training_prompts_carry_the_row_key_and_chat_fields_only() -> None:
    eval_test = resolve(ROWS)
    rows, prompts = eval_rows(eval_test), training_prompts(eval_test)
    assert prompts[0] == [{"role": "user", "content": "What is 2 + 2?", ROW_KEY: f"0:{rows[0].input_metadata.row_id}"}]
    assert prompts[2][0][ROW_KEY] == "2:capital-france" and ROW_KEY not in prompts[2][1]
    _, assistant, tool = prompts[3]
    assert assistant == {
        "role": "assistant",
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}
        ],
    }
    assert tool == {"role": "tool", "content": "sunny", "tool_call_id": "call_1", "name": "weather"}
    assert row_key(5, rows[5]) == f"5:{rows[5].input_metadata.row_id}"


def test_dataset_round_trip_maps_every_prompt_to_its_row() -> None:
    eval_test = resolve(ROWS)
    rows = eval_rows(eval_test)
    prompts = training_prompts(eval_test)
    column = Dataset.from_dict({"prompt": prompts * 2})["prompt"]
    assert column[0][0][ROW_KEY] and column[3][1]["tool_calls"] and column[3][0]["tool_calls"] is None
    matched = match_rows(column, rows, eval_test.qualified_name)
    assert [row.ground_truth for row in matched] == ["4", "4", "Paris", "sunny", "3", "7"] * 2
    assert matched[3].tools == rows[3].tools and matched[2].input_metadata.row_id == "capital-france"
    # Deep copies, one per prompt: the two identical rows, and the repeats, are separate objects.
    assert len({id(row) for row in matched}) == len(matched) and all(row is not rows[0] for row in matched)
    matched[0].messages.append(Message(role="assistant", content="4"))
    assert len(rows[0].messages) == 1 and len(matched[1].messages) == 1


def test_identical_rows_keep_their_positions_through_the_key() -> None:
    eval_test = resolve(ROWS)
    rows = eval_rows(eval_test)
    rows[1].input_metadata.session_data = {"marker": "second"}  # tell the two identical rows apart
    column = Dataset.from_dict({"prompt": training_prompts(eval_test)})["prompt"]
    first, second = match_rows([column[1], column[0]], rows, "eval")
    assert second.input_metadata.session_data is None and first.input_metadata.session_data == {"marker": "second"}


def test_prompts_without_the_key_match_by_content() -> None:
    eval_test = resolve(ROWS)
    rows = eval_rows(eval_test)
    hand_made = [strip_row_key(p) for p in training_prompts(eval_test)[:4]] + ["What is 2 + 2?"]
    column = Dataset.from_dict({"prompt": hand_made[:4]})["prompt"]
    matched = match_rows(list(column) + hand_made[4:], rows, "eval")
    assert [row.ground_truth for row in matched] == ["4", "4", "Paris", "sunny", "4"]
    assert matched[0].input_metadata.row_id == rows[0].input_metadata.row_id


def test_a_prompt_matching_no_row_is_an_error() -> None:
    rows = eval_rows(resolve(ROWS))
    prompt = [{"role": "user", "content": "What is 2 + 2? " + "x" * 100}]
    with pytest.raises(
        ConfigError,
        match=r"prompt 1 \('What is 2 \+ 2\? x+\.\.\.'\) matches no row of my_eval; "
        r"build the training dataset with ep_trl\.dataset_from_eval",
    ):
        match_rows([[{"role": "user", "content": "What is 2 + 2?"}], prompt], rows, "my_eval")


def test_a_prompt_matching_rows_with_different_ground_truth_is_ambiguous() -> None:
    rows = eval_rows(resolve(ROWS))
    ids = f"4:{rows[4].input_metadata.row_id}, 5:{rows[5].input_metadata.row_id}"
    with pytest.raises(ConfigError, match=rf"prompt 0 .*my_eval.*rows {ids}\..*dataset_from_eval.*row key"):
        match_rows([[{"role": "user", "content": "Pick a number from 1 to 9.", ROW_KEY: None}]], rows, "my_eval")


@pytest.mark.parametrize("key", ["1:some-other-id", "6:capital-france", "not-a-key"])
def test_a_stale_row_key_is_an_error(key: str) -> None:
    rows = eval_rows(resolve(ROWS))
    with pytest.raises(ConfigError, match=rf"row key '{key}'.*another version of the eval's data.*dataset_from_eval"):
        match_rows([[{"role": "user", "content": "What is 2 + 2?", ROW_KEY: key}]], rows, "my_eval")


def test_strip_row_key_drops_the_key_and_none_values() -> None:
    column = Dataset.from_dict({"prompt": training_prompts(resolve(ROWS))})["prompt"]
    assert strip_row_key(column[2]) == [
        {"role": "system", "content": "Answer in one word."},
        {"role": "user", "content": "What is the capital of France?"},
    ]


def write_jsonl(path: Path, records: list[dict[str, Any]]) -> str:
    import json

    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return str(path)


def test_an_input_dataset_replaces_the_evals_own_through_its_adapter_and_max_rows(tmp_path: Path) -> None:
    """``eval_rows(..., input_dataset=...)``: the files' records go through the eval's dataset_adapter and
    max_dataset_rows (3) as its own input_dataset's would, and nothing of the eval's own file is read."""
    records = [
        {"id": f"mine-{n}", "question": f"How many legs have {n} ducks?", "answer": str(2 * n)} for n in range(1, 5)
    ]
    first, second = write_jsonl(tmp_path / "a.jsonl", records[:2]), write_jsonl(tmp_path / "b.jsonl", records[2:])
    eval_test = resolve(f"{DATASET}::test_qa_dataset")
    rows = eval_rows(eval_test, [first, second])
    assert [(row.input_metadata.row_id, row.ground_truth) for row in rows] == [
        ("mine-1", "2"),
        ("mine-2", "4"),
        ("mine-3", "6"),
    ]
    assert [m.content for m in rows[0].messages] == ["Answer briefly.", "How many legs have 1 ducks?"]
    prompts = training_prompts(eval_test, [first, second])
    assert match_rows(prompts, rows, eval_test.qualified_name)[2].ground_truth == "6"
    with pytest.raises(ConfigError, match="names no row"):  # the keys are these rows', not the eval's own
        match_rows(prompts, eval_rows(eval_test), eval_test.qualified_name)


@pytest.mark.parametrize(
    "env_path, source",
    [
        (f"{MESSAGES}::test_qa_messages", "input_messages"),
        (ROWS, "input_rows"),
        (f"{LOADER}::test_qa_loader", "data_loaders"),
    ],
)
def test_an_input_dataset_for_an_eval_without_one_is_refused(env_path: str, source: str, tmp_path: Path) -> None:
    rows = write_jsonl(tmp_path / "rows.jsonl", [{"question": "?", "answer": "!"}])
    with pytest.raises(UnsupportedEvalError) as error:
        eval_rows(resolve(env_path), [rows])
    assert f"reads its rows from {source}, not from an input_dataset with a dataset_adapter" in str(
        error.value
    ) and "Drop the input dataset" in str(error.value)


def test_an_input_dataset_file_that_is_missing_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    eval_test = resolve(f"{DATASET}::test_qa_dataset")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"input dataset 'nope\.jsonl': no such file \(from .*\)\. Give JSONL files"):
        eval_rows(eval_test, ["nope.jsonl"])


def relative_dataset_eval(folder: Path) -> str:
    """An eval file whose input_dataset is relative to its own directory, as eval-protocol's benchmarks are to its
    repository."""
    (folder / "data").mkdir(parents=True)
    write_jsonl(folder / "data" / "rows.jsonl", [{"id": "near-1", "question": "Two plus two?", "answer": "4"}])
    source = (
        Path(DATASET)
        .read_text()
        .replace("input_dataset=[QA]", "input_dataset=['data/rows.jsonl']")
        .replace("def test_qa_dataset", "def test_relative")
    )
    (folder / "eval_relative.py").write_text(source)
    return f"{folder / 'eval_relative.py'}::test_relative"


def test_a_relative_input_dataset_missing_here_is_read_beside_the_evals_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    env_path = relative_dataset_eval(tmp_path / "evals")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    caplog.set_level(logging.INFO, logger="ep_trl")
    rows = eval_rows(resolve(env_path))
    assert [row.input_metadata.row_id for row in rows] == ["near-1"]
    assert (
        f"its input_dataset 'data/rows.jsonl' is not in the working directory ({tmp_path / 'elsewhere'}); using "
        f"{tmp_path / 'evals' / 'data' / 'rows.jsonl'}"
    ) in caplog.text
    (tmp_path / "evals" / "data" / "rows.jsonl").unlink()
    with pytest.raises(UnsupportedEvalError) as error:
        eval_rows(resolve(env_path))
    message = str(error.value)
    assert f"{tmp_path / 'elsewhere' / 'data' / 'rows.jsonl'} (from the working directory)" in message
    assert f"{tmp_path / 'evals' / 'data' / 'rows.jsonl'} (from the root its module" in message
    assert "ep-trl train --input-dataset FILE.jsonl" in message
