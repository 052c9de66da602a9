"""Async OpenEnv client for the letters game.

openenv-core 0.3 clients are async (``await env.reset()``); call ``.sync()``
for a blocking wrapper, which is what eval-protocol's OpenEnvRolloutProcessor
needs since it calls ``env.reset()``/``env.step()`` without awaiting.
"""

import logging
from typing import Any, Optional

from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient

from ep_trl.envs.letters.models import LettersAction, LettersObservation, LettersState

logger = logging.getLogger(__name__)


class LettersEnv(EnvClient[LettersAction, LettersObservation, LettersState]):
    """WebSocket client for one letters session.

    ``reset`` forwards keyword arguments to the server's ``reset`` (e.g.
    ``task_name="digits"``, ``max_steps=5``, ``episode_id=...``).
    """

    def __init__(
        self,
        base_url: str,
        *,
        task_name: Optional[str] = None,
        max_steps: Optional[int] = None,
        **kwargs: Any,
    ) -> None:
        """Create the client; keyword arguments other than the two below go to OpenEnv's ``EnvClient``.

        ``task_name``/``max_steps`` are defaults sent with every ``reset`` that
        does not name its own: callers that never pass reset arguments (such as
        eval-protocol's processor, which calls a bare ``env.reset()``) can still
        pick a task per client, whereas ``LETTERS_TASK`` is read by the server
        process. Other keyword arguments go to ``EnvClient``.
        """
        super().__init__(base_url=base_url, **kwargs)
        self._reset_defaults: dict[str, Any] = {}
        if task_name is not None:
            self._reset_defaults["task_name"] = task_name
        if max_steps is not None:
            self._reset_defaults["max_steps"] = int(max_steps)

    async def reset(self, **kwargs: Any) -> StepResult[LettersObservation]:
        """Start an episode; explicit kwargs override the constructor's defaults."""
        return await super().reset(**{**self._reset_defaults, **kwargs})

    def _step_payload(self, action: LettersAction) -> dict[str, Any]:
        """Serialize the action; the text is sent unchanged."""
        return action.model_dump()

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[LettersObservation]:
        """Rebuild the observation, putting back reward/done that the server sends beside it."""
        reward = payload.get("reward")
        done = bool(payload.get("done", False))
        obs = LettersObservation(**payload.get("observation", {}), reward=reward, done=done)
        return StepResult(observation=obs, reward=reward, done=done)

    def _parse_state(self, payload: dict[str, Any]) -> LettersState:
        """Parse the server's state dict."""
        return LettersState(**payload)
