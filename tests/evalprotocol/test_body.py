"""The eval body run as eval-protocol runs it, on a row shaped like its processor's."""

import asyncio

import pytest

from ep_trl.evalprotocol import build_row, read_eval_spec, resolve_eval_test, run_body, score_of


def test_body_runs_on_a_row_shaped_like_the_processors() -> None:
    spec = read_eval_spec(resolve_eval_test("tests.evals.eval_letters"))
    row = build_row(
        messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "aeiou"}],
        eval_name=spec.name,
        row_id="r",
        rollout_id="x",
        invocation_id="i",
        experiment_id="e",
        run_id="s",
        completion_params={},
        extra={"step_rewards": [1.0, 0.5]},
    )
    (scored,) = asyncio.run(run_body(spec, [row], timeout_s=30.0))
    assert score_of(scored) == pytest.approx(0.75)
    assert scored.execution_metadata.rollout_id == "x"
