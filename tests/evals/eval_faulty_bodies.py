"""Letters evals whose scoring bodies misbehave on purpose (fault injection): no row back, a NaN score, a body
slower than any sane timeout. The episodes themselves are normal letters episodes."""

import itertools
import math
import time
from typing import TYPE_CHECKING, Any

from eval_protocol.models import EvaluateResult, EvaluationRow
from eval_protocol.pytest import evaluation_test
from eval_protocol.pytest.openenv_rollout_processor import OpenEnvRolloutProcessor

from tests.evals import letters_parts as parts

if TYPE_CHECKING:
    from collections.abc import Callable

SLOW_BODY_S = 30.0


def letters_eval(body: "Callable[[EvaluationRow], EvaluationRow]") -> Any:
    return evaluation_test(
        input_messages=parts.INPUT_MESSAGES,
        completion_params=parts.COMPLETION_PARAMS,
        rollout_processor=OpenEnvRolloutProcessor(
            env_factory=parts.make_env_factory(), prompt_builder=parts.prompt_builder, action_parser=parts.action_parser
        ),
        steps=parts.STEPS,
        max_concurrent_rollouts=parts.MAX_CONCURRENT_ROLLOUTS,
        mode="pointwise",
    )(body)


@letters_eval
def test_returns_none(row: EvaluationRow) -> EvaluationRow:
    """Forgets to return the row."""
    row.evaluation_result = EvaluateResult(score=1.0, reason="scored, but not returned")


@letters_eval
def test_returns_a_float(row: EvaluationRow) -> EvaluationRow:
    """Returns the score instead of the row."""
    return 1.0


_bodies_called = itertools.count()


@letters_eval
def test_nan_score(row: EvaluationRow) -> EvaluationRow:
    """Scores every other row it is called on NaN."""
    rewards = parts.step_rewards(row)
    score = math.nan if next(_bodies_called) % 2 == 0 else sum(rewards) / len(rewards)
    row.evaluation_result = EvaluateResult(score=score, reason="sometimes NaN")
    return row


@letters_eval
def test_slow(row: EvaluationRow) -> EvaluationRow:
    """Takes far longer than the test's body timeout."""
    time.sleep(SLOW_BODY_S)
    row.evaluation_result = EvaluateResult(score=1.0, reason="late")
    return row
