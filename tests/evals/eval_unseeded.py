"""An OpenEnv eval whose environment ignores reset seeds: every reset deals a fresh random word, whatever the seed.

``ep-trl train --held-out N`` must refuse it (tests/cli/test_heldout.py): held-out seeds would name no instance, so
training could play what is held out. The environment is a plain synchronous client, as hand-written ones are.
"""

import random
from dataclasses import dataclass

from eval_protocol.models import EvaluateResult, EvaluationRow, Message
from eval_protocol.pytest import evaluation_test
from eval_protocol.pytest.openenv_rollout_processor import OpenEnvRolloutProcessor


@dataclass(frozen=True)
class Observation:
    word: str


@dataclass(frozen=True)
class StepResult:
    observation: Observation
    reward: float | None
    done: bool


class UnseededEnv:
    """Deals a random word at each reset; the seed is accepted and ignored."""

    def __init__(self) -> None:
        self._rng = random.Random()
        self._word = ""

    def reset(self, seed: int | None = None, **kwargs: object) -> StepResult:
        self._word = "".join(self._rng.choice("abcdefghij") for _ in range(8))
        return StepResult(Observation(self._word), None, False)

    def step(self, action: str) -> StepResult:
        return StepResult(Observation(self._word), float(action == self._word), True)

    def close(self) -> None:
        return None


@evaluation_test(
    input_messages=[[[Message(role="system", content="Repeat the word.")]]],
    completion_params=[{"model": "local-policy", "temperature": 0.0, "max_tokens": 8}],
    rollout_processor=OpenEnvRolloutProcessor(
        env_factory=UnseededEnv,
        prompt_builder=lambda observation, step, history: f"Word: {observation.word}",
        action_parser=lambda text: text.strip(),
    ),
    steps=1,
    mode="pointwise",
)
def test_unseeded(row: EvaluationRow) -> EvaluationRow:
    rewards = [float(r) for r in (row.execution_metadata.extra or {}).get("step_rewards", [])]
    row.evaluation_result = EvaluateResult(score=sum(rewards), reason=f"step rewards {rewards}")
    return row
