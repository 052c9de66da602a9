"""Guess game eval against a running server (as eval-protocol's echo base-URL example).

``GUESS_ENV_URL`` is read when this module is imported. A server plays the one game its ``GUESS_GAME``
named when it started; ``tasks``/``task_var`` say which games the eval covers.
"""

import os
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
except ImportError:
    GuessEnv = None

GUESS_ENV_URL = os.environ.get("GUESS_ENV_URL", "http://127.0.0.1:8000")


def prompt_builder(observation: Any, step: int, history: List[str]) -> str:
    prompt_text = getattr(observation, "prompt", "") or ""
    feedback = getattr(observation, "feedback", "") or ""
    return f"{prompt_text}\n(last result: {feedback or 'none'})"


def action_parser(response_text: str) -> "GuessAction":
    try:
        from tests.fixtures.guess_env import GuessAction
    except ImportError:
        pytest.skip("The guess environment package is not installed; skipping the guess URL eval.")
        raise
    text = response_text.strip() if isinstance(response_text, str) else ""
    return GuessAction(guess=text or "?")


@evaluation_test(
    input_messages=[[[Message(role="user", content="Play the guessing game.")]]],
    completion_params=[
        {
            "temperature": 0.0,
            "max_tokens": 8,
            "model": "fireworks_ai/accounts/fireworks/models/qwen3-8b",
        }
    ],
    num_runs=1,
    max_concurrent_rollouts=2,
    steps=3,
    mode="pointwise",
    rollout_processor=(
        OpenEnvRolloutProcessor(
            env_client_cls=GuessEnv,
            env_base_url=GUESS_ENV_URL,  # e.g. http://127.0.0.1:8000 (local server or docker)
            tasks=["vowels", "digits"],
            task_var="GUESS_GAME",
            prompt_builder=prompt_builder,
            action_parser=action_parser,
        )
        if GuessEnv is not None
        else None
    ),
)
def test_guess_url(row: EvaluationRow) -> EvaluationRow:
    """Score = mean step reward."""
    if GuessEnv is None:
        pytest.skip("The guess environment package is not installed; skipping the guess URL eval.")
    step_rewards: List[float] = []
    extra = getattr(row.execution_metadata, "extra", None)
    if isinstance(extra, dict):
        step_rewards = [float(r) for r in extra.get("step_rewards") or []]
    score = sum(step_rewards) / len(step_rewards) if step_rewards else 0.0
    row.evaluation_result = EvaluateResult(score=score, reason=f"mean of {step_rewards}")
    return row
