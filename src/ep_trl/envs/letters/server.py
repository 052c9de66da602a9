"""ASGI app serving the letters game with openenv-core's stock server.

``app`` is what ``uvicorn ep_trl.envs.letters.server:app`` (or
``python -m ep_trl.envs.letters``) serves: openenv's routes (``/ws`` sessions,
``/health``, ``/schema``, ...) plus ``GET /episodes`` and ``POST /episodes/clear``
exposing the server-wide episode record for tests.
"""

import logging
import os
from typing import Any

from fastapi import FastAPI
from openenv.core.env_server.http_server import create_app

from ep_trl.envs.letters.environment import LettersEnvironment
from ep_trl.envs.letters.episode_log import EPISODE_LOG
from ep_trl.envs.letters.models import LettersAction, LettersObservation

logger = logging.getLogger(__name__)

#: Concurrent WebSocket sessions the server accepts (one env instance each).
#: Above openenv's default of 1 so batched rollouts (up to 32 at once) and
#: benchmarks never hit CAPACITY_REACHED.
MAX_CONCURRENT_ENVS = 64
#: Sets the session limit in place of ``MAX_CONCURRENT_ENVS`` (tests make a server at capacity with it).
MAX_SESSIONS_ENV_VAR = "LETTERS_MAX_SESSIONS"


def build_app() -> FastAPI:
    """Create the FastAPI app: openenv routes plus the episode-record routes."""
    application = create_app(
        LettersEnvironment,
        LettersAction,
        LettersObservation,
        env_name="letters",
        max_concurrent_envs=int(os.environ.get(MAX_SESSIONS_ENV_VAR) or MAX_CONCURRENT_ENVS),
    )

    @application.get("/episodes", tags=["Letters"], summary="Every episode this server has seen")
    async def list_episodes() -> list[dict[str, Any]]:
        """Episodes oldest first: id, task, actions (exact text), rewards, done, error."""
        return EPISODE_LOG.snapshot()

    @application.post("/episodes/clear", tags=["Letters"], summary="Forget all recorded episodes")
    async def clear_episodes() -> dict[str, int]:
        """Drop the record (tests call it to isolate themselves); returns the count dropped."""
        cleared = EPISODE_LOG.clear()
        logger.info("Cleared %d recorded episodes", cleared)
        return {"cleared": cleared}

    return application


app = build_app()
