"""Scoring finished episodes' rows with the eval's body: pointwise one row per body call, groupwise (and ``all``)
the rows together, so a groupwise score is relative to the rows it was given."""

import asyncio
from typing import TYPE_CHECKING

import pytest

from ep_trl.engine.scoring import score_rows
from ep_trl.evalprotocol import build_row, read_eval_spec, resolve_eval_test

if TYPE_CHECKING:
    from ep_trl.trajectory.types import Row


def _row(rollout_id: str, rewards: list[float]) -> "Row":
    return build_row(
        messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "aeiou"}],
        eval_name="letters",
        row_id="r",
        rollout_id=rollout_id,
        invocation_id="i",
        experiment_id="e",
        run_id="s",
        completion_params={},
        extra={"step_rewards": rewards},
    )


def test_pointwise_rows_are_scored_one_by_one() -> None:
    spec = read_eval_spec(resolve_eval_test("tests.evals.eval_letters"))
    scored = asyncio.run(score_rows(spec, [_row("a", [1.0, 0.5]), _row("b", [0.0, 0.5])], timeout_s=30.0))
    assert [s.score for s in scored] == [pytest.approx(0.75), pytest.approx(0.25)]
    assert [s.row.execution_metadata.rollout_id for s in scored] == ["a", "b"]
    assert all(s.error is None for s in scored)


def test_groupwise_rows_are_scored_together() -> None:
    spec = read_eval_spec(resolve_eval_test("tests.evals.eval_letters_groupwise"))
    scored = asyncio.run(score_rows(spec, [_row("a", [1.0, 1.0]), _row("b", [0.5, 0.5])], timeout_s=30.0))
    assert [s.score for s in scored] == [pytest.approx(1.0), pytest.approx(0.5)]  # relative to the group's best
