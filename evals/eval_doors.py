"""An eval-protocol eval of the doors game (``ep_trl.envs.doors``), a multi-turn OpenEnv text environment whose
rooms must be read to leave them: each room shows four coloured doors and says which one opens ("The blue door is
open; the others are locked." or "Every door is locked except the blue one."). The player has
4 moves to leave 2 rooms; a locked door stays shut and the next turn says so. The score is 1 when the player left the
house, else 0.

The game server runs locally (``python -m ep_trl.envs.doors --port 8012``); this eval finds it through
``DOORS_ENV_URL``. Run it against any OpenAI-compatible server::

    pytest -p eval_protocol evals/eval_doors.py \\
        --ep-input-param model=hosted_vllm/SmolLM2-135M-Instruct --ep-input-param base_url=http://127.0.0.1:8000/v1

``recipes/doors/smollm2.py`` trains SmolLM2-135M-Instruct on it.
"""

import os

from eval_protocol.models import EvaluateResult, EvaluationRow, Message
from eval_protocol.pytest import evaluation_test
from eval_protocol.pytest.openenv_rollout_processor import OpenEnvRolloutProcessor

from ep_trl.envs.doors import DoorsAction, DoorsEnv, DoorsObservation, parse_door

ENV_URL_VAR = "DOORS_ENV_URL"
DEFAULT_ENV_URL = "http://127.0.0.1:8012"
SYSTEM_PROMPT = "You are in a room with four doors. Pick the door that opens. Answer with its color only."


def make_env():
    """A blocking doors client: eval-protocol's own processor calls reset()/step() without awaiting."""
    return DoorsEnv(base_url=os.environ.get(ENV_URL_VAR, DEFAULT_ENV_URL)).sync()


def build_prompt(observation: DoorsObservation, step: int, history: list[str]) -> str:
    """The room as the game describes it (with what the last move did), then the answer's form."""
    return f"{observation.text} Answer with the door's color."


def parse_action(text: str) -> DoorsAction:
    """The door the reply names (its first colour word, ``ep_trl.envs.doors.parse_door``); an empty door, which the
    game answers "You did not name a door.", when it names none."""
    return DoorsAction(door=parse_door(text) or "")


@evaluation_test(
    input_messages=[[[Message(role="system", content=SYSTEM_PROMPT)]]],
    completion_params=[
        {
            "model": "hosted_vllm/SmolLM2-135M-Instruct",
            "base_url": "http://127.0.0.1:8000/v1",
            "temperature": 0.0,
            "max_tokens": 16,
        }
    ],
    rollout_processor=OpenEnvRolloutProcessor(
        env_factory=make_env, prompt_builder=build_prompt, action_parser=parse_action
    ),
    steps=4,
    max_concurrent_rollouts=8,
    mode="pointwise",
)
def test_doors(row: EvaluationRow) -> EvaluationRow:
    """Score 1 when the player left the house within its moves, else 0."""
    rewards = [float(r) for r in (row.execution_metadata.extra or {}).get("step_rewards", [])]
    if not rewards:
        raise ValueError("the episode took no step")
    escaped = max(rewards) > 0
    row.evaluation_result = EvaluateResult(
        score=1.0 if escaped else 0.0,
        is_score_valid=True,
        reason=f"{'left the house' if escaped else 'still inside'} after {len(rewards)} moves",
    )
    return row
