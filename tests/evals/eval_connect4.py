"""Connect Four eval, environment from a Docker image, written as eval-protocol's OpenEnv examples are.

The client is OpenEnv's own ``connect4_env`` package (tests/fixtures/openenv_repo: ``envs/connect4_env`` of OpenEnv's
repository, unchanged), imported from its project folder as a checkout of OpenEnv's ``envs/`` is. The processor names
the image OpenEnv's README builds from it; ``ep-trl train --env-provider uv`` runs the package's own uv project
instead (OpenEnv's ``UVProvider``), and without a provider ep_trl serves the package with the training Python.

The policy plays both sides (the environment has no opponent): each reply's first digit is the column. A move into a
full or missing column ends the game with reward -1; the score is the share of the ``steps`` moves that were legal.
"""

import re
import sys
from pathlib import Path
from typing import Any, List

from eval_protocol.models import EvaluateResult, EvaluationRow, Message
from eval_protocol.pytest import evaluation_test
from eval_protocol.pytest.openenv_rollout_processor import OpenEnvRolloutProcessor

#: The folder holding OpenEnv's environment packages (as a checkout's ``envs/``).
OPENENV_ENVS = Path(__file__).resolve().parents[1] / "fixtures" / "openenv_repo"
if str(OPENENV_ENVS) not in sys.path:
    sys.path.insert(0, str(OPENENV_ENVS))

from connect4_env import Connect4Action, Connect4Env  # noqa: E402  (OpenEnv's package, from its folder)

#: Moves per game.
STEPS = 3


def prompt_builder(observation: Any, step: int, history: List[str]) -> str:
    """The board (1: first player, -1: second, 0: empty; top row first) and the legal columns."""
    board = "\n".join(" ".join(f"{cell:2d}" for cell in row) for row in getattr(observation, "board", []))
    legal = ", ".join(str(column) for column in getattr(observation, "legal_actions", []))
    return f"Move {step + 1}. Connect Four board:\n{board}\nLegal columns: {legal}. Answer with one column number."


def action_parser(response_text: str) -> Connect4Action:
    """The first digit of the reply is the column; a reply without one plays column 7 (off the board: illegal)."""
    found = re.search(r"\d", response_text if isinstance(response_text, str) else "")
    return Connect4Action(column=int(found.group()) if found else 7)


@evaluation_test(
    input_messages=[[[Message(role="user", content="Let's play Connect Four. You drop a piece each turn.")]]],
    completion_params=[
        {"temperature": 1.0, "max_tokens": 8, "model": "fireworks_ai/accounts/fireworks/models/qwen3-8b"}
    ],
    num_runs=1,
    max_concurrent_rollouts=2,
    steps=STEPS,
    mode="pointwise",
    rollout_processor=OpenEnvRolloutProcessor(
        env_client_cls=Connect4Env,
        docker_image="connect4-env:latest",
        prompt_builder=prompt_builder,
        action_parser=action_parser,
        num_generations=1,
    ),
)
def test_connect4(row: EvaluationRow) -> EvaluationRow:
    """Score = legal moves / ``STEPS`` (an illegal move ends the game with step reward -1)."""
    extra = row.execution_metadata.extra if isinstance(row.execution_metadata.extra, dict) else {}
    rewards = [float(r) for r in extra.get("step_rewards") or []]
    legal = sum(1 for r in rewards if r > -1)
    row.evaluation_result = EvaluateResult(
        score=legal / STEPS, reason=f"{legal} legal moves of {STEPS} ({len(rewards)} played)"
    )
    return row
