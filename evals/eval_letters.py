"""An eval-protocol eval of the letters game, the environment behind ep_trl's CPU demo training run.

The game server runs locally (``python -m ep_trl.envs.letters --port 8011``); this eval finds it through
``LETTERS_ENV_URL``. Each turn the model writes a word; the step reward is the fraction of its characters in the
task's alphabet; the eval's score is the mean step reward. ``recipes/letters/tiny.py`` trains on it.
"""

import os

from eval_protocol.models import EvaluateResult, EvaluationRow, Message
from eval_protocol.pytest import evaluation_test
from eval_protocol.pytest.openenv_rollout_processor import OpenEnvRolloutProcessor

from ep_trl.envs.letters import LettersAction, LettersEnv, LettersObservation


def make_env():
    # A sync client: eval-protocol's own processor calls reset()/step() without awaiting.
    return LettersEnv(base_url=os.environ.get("LETTERS_ENV_URL", "http://127.0.0.1:8011")).sync()


def build_prompt(observation: LettersObservation, step: int, history: list[str]) -> str:
    return observation.prompt


def parse_action(text: str) -> LettersAction:
    return LettersAction(text=text.strip())


@evaluation_test(
    input_messages=[[[Message(role="system", content="You play a word game. Answer with one short word.")]]],
    completion_params=[{"model": "local-policy", "temperature": 0.0, "max_tokens": 8}],
    rollout_processor=OpenEnvRolloutProcessor(
        env_factory=make_env,
        prompt_builder=build_prompt,
        action_parser=parse_action,
        tasks=["vowels", "abc"],
        task_var="LETTERS_TASK",
    ),
    steps=2,
    max_concurrent_rollouts=8,
    mode="pointwise",
)
def test_letters(row: EvaluationRow) -> EvaluationRow:
    rewards = [float(r) for r in (row.execution_metadata.extra or {}).get("step_rewards", [])]
    if not rewards:
        raise ValueError("the episode took no step")
    row.evaluation_result = EvaluateResult(
        score=sum(rewards) / len(rewards), reason=f"mean of step rewards {rewards}", is_score_valid=True
    )
    return row
