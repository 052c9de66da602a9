"""The eval's own dataset becomes the training prompts, each mapping back to its row."""

import pytest

from ep_trl import ConfigError, dataset_from_eval
from ep_trl.evalprotocol import ROW_KEY, eval_rows, match_rows, resolve_eval_test, strip_row_key

ROWS = "tests/evals/eval_inputs_rows.py::test_qa_rows"


def test_input_messages_become_conversational_prompts() -> None:
    ds = dataset_from_eval("tests.evals.eval_letters", repeat=3)
    assert len(ds) == 3
    [message] = ds[0]["prompt"]
    assert message[ROW_KEY].startswith("0:") and len(message[ROW_KEY]) > 2
    assert strip_row_key(ds[0]["prompt"]) == [{"role": "user", "content": "Play the letters game."}]


def test_repeated_prompts_map_back_to_their_rows() -> None:
    eval_test = resolve_eval_test(ROWS)
    rows = eval_rows(eval_test)
    ds = dataset_from_eval(ROWS, repeat=2)
    assert len(ds) == 2 * len(rows) == 12
    matched = match_rows(ds["prompt"], rows, eval_test.qualified_name)
    assert [row.ground_truth for row in matched] == ["4", "4", "Paris", "sunny", "3", "7"] * 2
    # The two identical rows (same row_id) keep distinct positions, so are told apart by the key alone.
    keys = [prompt[0][ROW_KEY] for prompt in ds["prompt"]]
    assert keys[0] != keys[1] and keys[0].split(":")[1] == keys[1].split(":")[1] and keys[:6] == keys[6:]
    assert [row.input_metadata.row_id for row in matched[:6]] == [row.input_metadata.row_id for row in rows]


def test_rows_that_changed_since_the_dataset_was_built_are_an_error() -> None:
    eval_test = resolve_eval_test(ROWS)
    ds = dataset_from_eval(ROWS)
    rows = eval_rows(eval_test)
    del rows[0]  # the eval's data lost a row: every later key now points one row too far
    with pytest.raises(ConfigError, match="another version of the eval's data.*dataset_from_eval"):
        match_rows(ds["prompt"][1:3], rows, eval_test.qualified_name)


def test_repeat_must_be_positive() -> None:
    with pytest.raises(ValueError, match="repeat"):
        dataset_from_eval("tests.evals.eval_letters", repeat=0)
