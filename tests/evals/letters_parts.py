"""Pieces shared by the letters eval modules (not an eval module itself).

OpenEnv (and through it gradio) is imported only when an environment is made or an action parsed, so an eval that
takes only the prompt and settings from here (``eval_single_turn``) imports no OpenEnv, as a user's processor eval
would not (pinned by ``tests/project/test_import.py``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Optional

from eval_protocol.models import EvaluationRow, Message

from tests.support.letters import LETTERS_ENV_URL_VAR

if TYPE_CHECKING:
    from openenv.core.sync_client import SyncEnvClient

    from ep_trl.envs.letters import LettersAction, LettersObservation

INPUT_MESSAGES = [[[Message(role="user", content="Play the letters game.")]]]
COMPLETION_PARAMS = [{"model": "tiny-letters", "temperature": 0.0, "max_tokens": 12}]
STEPS = 3
MAX_CONCURRENT_ROLLOUTS = 4
TASK_VAR = "LETTERS_TASK"


def make_env_factory(task_name: Optional[str] = None) -> Callable[[], SyncEnvClient]:
    """Return an ``env_factory`` for OpenEnvRolloutProcessor.

    The URL is read from ``LETTERS_ENV_URL`` when the factory is *called*, so
    importing an eval module needs no server. A sync client is returned because
    eval-protocol's processor calls ``env.reset()``/``env.step()`` without await.
    ``task_name`` pins the task client-side: the processor ignores ``tasks``
    when given an ``env_factory`` and ``LETTERS_TASK`` is read by the server.
    """

    def make_letters_env() -> SyncEnvClient:
        from ep_trl.envs.letters import LettersEnv

        url = os.environ[LETTERS_ENV_URL_VAR]
        return LettersEnv(base_url=url, task_name=task_name).sync()

    return make_letters_env


def prompt_builder(obs: LettersObservation, step: int, history: list[str]) -> str:
    """The env's own prompt is the user message for each turn."""
    return obs.prompt


def action_parser(text: str) -> LettersAction:
    """Send the model's text unchanged (tests compare it with sampled tokens)."""
    from ep_trl.envs.letters import LettersAction

    return LettersAction(text=text)


def step_rewards(row: EvaluationRow) -> list[float]:
    """Per-step rewards the processor recorded for this row."""
    extra: dict[str, Any] = row.execution_metadata.extra or {}
    return [float(r) for r in extra.get("step_rewards", [])]
