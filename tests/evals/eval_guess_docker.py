"""Guess game eval, environment from a Docker image (as eval-protocol's TextArena/BrowserGym Docker examples).

The processor starts ``guess-env:latest`` once per episode with ``GUESS_GAME`` set to the episode's task
(``task_var``) and the ``env_vars`` below. ``GUESS_MAX_STEPS=2`` makes the server end an episode after two
guesses, fewer than ``steps=4``: an episode of more than two steps means ``env_vars`` never reached the server.
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

# Skip these integration-heavy tests on CI runners by default
pytestmark = pytest.mark.skipif(os.getenv("CI") == "true", reason="Skip OpenEnv integration tests on CI")


def prompt_builder(observation: Any, step: int, history: List[str]) -> str:
    """The game's own instructions, with the last few guesses."""
    prompt_text = getattr(observation, "prompt", "") or ""
    previous = "\n".join(history[-3:]) if history else "None"
    return f"Step {step}\n{prompt_text}\nPrevious guesses:\n{previous}\nYour guess:"


def action_parser(response_text: str) -> "GuessAction":
    """The model's reply, stripped, is the guess."""
    try:
        from tests.fixtures.guess_env import GuessAction
    except ImportError:
        pytest.skip("The guess environment package is not installed; skipping the guess eval.")
        raise
    text = response_text.strip() if isinstance(response_text, str) else ""
    return GuessAction(guess=text)


@evaluation_test(
    input_messages=[[[Message(role="user", content="Let's play a guessing game.")]]],
    completion_params=[
        {
            "temperature": 0.7,
            "max_tokens": 8,
            "model": "fireworks_ai/accounts/fireworks/models/qwen3-8b",
        }
    ],
    num_runs=1,
    max_concurrent_rollouts=2,
    steps=4,
    mode="pointwise",
    rollout_processor=(
        OpenEnvRolloutProcessor(
            env_client_cls=GuessEnv,
            docker_image="guess-env:latest",
            tasks=["vowels", "digits"],
            task_var="GUESS_GAME",
            env_vars={"GUESS_MAX_STEPS": "2"},
            prompt_builder=prompt_builder,
            action_parser=action_parser,
            num_generations=1,
        )
        if GuessEnv is not None
        else None
    ),
)
def test_guess_docker(row: EvaluationRow) -> EvaluationRow:
    """Score = mean step reward (each step's reward is in [0, 1])."""
    if GuessEnv is None:
        pytest.skip("The guess environment package is not installed; skipping the guess eval.")
    step_rewards: List[float] = []
    extra = getattr(row.execution_metadata, "extra", None)
    if isinstance(extra, dict):
        step_rewards = [float(r) for r in extra.get("step_rewards") or []]
    score = sum(step_rewards) / len(step_rewards) if step_rewards else 0.0
    row.evaluation_result = EvaluateResult(
        score=max(0.0, min(1.0, score)),
        reason=f"mean reward {score:.3f} over {len(step_rewards)} guesses",
    )
    return row
