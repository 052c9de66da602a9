"""ASGI app serving BrowserGym MiniWoB++ with openenv-core's stock server.

``app`` is what ``uvicorn ep_trl.envs.browsergym.server:app`` (or
``python -m ep_trl.envs.browsergym``) serves: openenv's routes (``/ws`` sessions,
``/health``, ``/schema``, ...) plus ``GET /tasks``.

How openenv runs this environment (openenv-core 0.3, ``HTTPEnvServer``):

* each WebSocket session gets its own ``BrowserGymEnvironment`` (created via the
  class, in a per-session single-thread executor) and its sync ``reset``/``step``
  run in that executor, so sessions proceed in parallel;
* when the socket closes (client ``close`` message, disconnect, or error) the
  session is destroyed and ``env.close()`` runs in the same executor, with
  exceptions swallowed by openenv, so ``close`` logs its own failures;
* HTTP ``POST /reset``/``/step`` create a throwaway instance per request and close
  it right after (a stateless reset launches and closes a browser: use ``/ws``);
* sessions beyond ``max_concurrent_envs`` are refused with CAPACITY_REACHED.

openenv does not close live sessions at shutdown, so the app does it.
"""

import asyncio
import logging
from typing import Optional

from fastapi import FastAPI
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.types import ConcurrencyConfig
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.websockets import WebSocketDisconnect

from ep_trl.envs.browsergym.config import max_sessions_from_env, session_timeout_from_env
from ep_trl.envs.browsergym.environment import BrowserGymEnvironment, close_all_environments
from ep_trl.envs.browsergym.models import BrowserGymAction, BrowserGymObservation
from ep_trl.envs.browsergym.tasks import available_tasks, default_task

logger = logging.getLogger(__name__)


class QuietClientCloseMiddleware:
    """Drop the WebSocketDisconnect openenv raises when a client closed first.

    openenv's ``/ws`` handler ends by calling ``websocket.close()`` after its
    cleanup (which includes closing the browser, ~0.5 s); a client that sent
    ``close`` and hung up meanwhile makes that call raise WebSocketDisconnect,
    which openenv does not catch, so uvicorn logged an ERROR traceback for every
    normal session end. The session is fully cleaned up by then.
    """

    def __init__(self, app: ASGIApp) -> None:
        """Wrap ``app``."""
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass through; for WebSocket scopes, treat a late disconnect as a normal end."""
        if scope["type"] != "websocket":
            await self.app(scope, receive, send)
            return
        try:
            await self.app(scope, receive, send)
        except WebSocketDisconnect as exc:
            logger.debug("WebSocket client left before the server closed the socket (code %s)", exc.code)


def build_app(max_sessions: Optional[int] = None, session_timeout_s: Optional[float] = None) -> FastAPI:
    """Create the app; unset arguments come from ``BROWSERGYM_MAX_SESSIONS`` / ``BROWSERGYM_SESSION_TIMEOUT_S``.

    ``max_sessions`` bounds concurrent WebSocket sessions, i.e. browsers (default 2).
    ``session_timeout_s`` closes sessions idle that long (default: never), which
    frees browsers of clients that vanished without closing their socket.
    """
    sessions = max_sessions if max_sessions is not None else max_sessions_from_env()
    timeout = session_timeout_s if session_timeout_s is not None else session_timeout_from_env()
    application = create_app(
        BrowserGymEnvironment,
        BrowserGymAction,
        BrowserGymObservation,
        env_name="browsergym",
        concurrency_config=ConcurrencyConfig(max_concurrent_envs=sessions, session_timeout=timeout),
    )

    @application.get("/tasks", tags=["BrowserGym"], summary="MiniWoB tasks this server can reset to")
    async def list_tasks() -> dict[str, object]:
        """The default task and every valid ``task_name``."""
        return {"default": default_task(), "tasks": list(available_tasks())}

    async def close_open_environments() -> None:
        """Close browsers of sessions still open at shutdown (openenv leaves them)."""
        await asyncio.to_thread(close_all_environments)

    application.router.on_shutdown.append(close_open_environments)
    application.add_middleware(QuietClientCloseMiddleware)
    logger.debug("BrowserGym app built: max %d sessions, idle timeout %s", sessions, timeout)
    return application


app = build_app()
