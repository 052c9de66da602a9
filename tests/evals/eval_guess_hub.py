"""Guess game eval, environment from the Hugging Face hub (as eval-protocol's echo hub example).

One task: the processor launches ``openenv/guess-env`` with ``GUESS_GAME=digits``.
"""

from typing import TYPE_CHECKING, Any, List

import pytest
from eval_protocol.models import EvaluateResult, EvaluationRow, Message
from eval_protocol.pytest import evaluation_test
from eval_protocol.pytest.openenv_rollout_processor import OpenEnvRolloutProcessor

if TYPE_CHECKING:
    from tests.fixtures.guess_env import GuessAction

# the guess environment's client class; None where its package is not installed
GuessEnv: type[Any] | None
try:
    from tests.fixtures.guess_env import GuessEnv

    _HAS_GUESS = True
except ImportError:
    GuessEnv = None
    _HAS_GUESS = False


def prompt_builder(observation: Any, step: int, history: List[str]) -> str:
    """The game's instructions are the whole prompt."""
    return getattr(observation, "prompt", "") or "Guess a digit."


def action_parser(response_text: str) -> "GuessAction":
    """The first digit in the reply is the guess; the raw text when there is none."""
    try:
        from tests.fixtures.guess_env import GuessAction
    except ImportError:
        pytest.skip("The guess environment package is not installed; skipping the guess hub eval.")
        raise
    text = response_text.strip() if isinstance(response_text, str) else ""
    digits = [ch for ch in text if ch.isdigit()]
    return GuessAction(guess=digits[0] if digits else text)


@evaluation_test(
    input_messages=[[[Message(role="user", content="Guess the digits.")]]],
    completion_params=[
        {
            "temperature": 0.0,
            "max_tokens": 4,
            "model": "fireworks_ai/accounts/fireworks/models/kimi-k2-instruct",
        }
    ],
    num_runs=1,
    max_concurrent_rollouts=1,
    steps=3,
    mode="pointwise",
    rollout_processor=(
        OpenEnvRolloutProcessor(
            # Launch the environment from its hub repo
            env_client_cls=GuessEnv,
            hub_repo_id="openenv/guess-env",
            tasks=["digits"],
            task_var="GUESS_GAME",
            prompt_builder=prompt_builder,
            action_parser=action_parser,
            timeout_ms=5000,
            num_generations=1,
        )
        if _HAS_GUESS
        else None
    ),
)
def test_guess_hub(row: EvaluationRow) -> EvaluationRow:
    """Score = total reward / 3 guesses, clipped to [0, 1]."""
    if not _HAS_GUESS:
        pytest.skip("The guess environment package is not installed; skipping the guess hub eval.")
    total = 0.0
    steps = 0
    try:
        extra = getattr(row.execution_metadata, "extra", None)
        if isinstance(extra, dict):
            raw = extra.get("step_rewards") or []
            total = float(sum(float(r) for r in raw))
            steps = len(raw)
    except Exception:
        total = 0.0
    score = max(0.0, min(1.0, total / 3.0))
    row.evaluation_result = EvaluateResult(score=score, reason=f"total reward {total:.2f} over {steps} steps")
    return row
