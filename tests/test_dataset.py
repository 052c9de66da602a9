"""The eval's own dataset becomes the training prompts."""

import pytest

from ep_trl import dataset_from_eval


def test_input_messages_become_conversational_prompts():
    ds = dataset_from_eval("tests.evals.eval_letters", repeat=3)
    assert len(ds) == 3
    assert ds[0]["prompt"] == [{"role": "user", "content": "Play the letters game."}]


def test_repeat_must_be_positive():
    with pytest.raises(ValueError, match="repeat"):
        dataset_from_eval("tests.evals.eval_letters", repeat=0)
