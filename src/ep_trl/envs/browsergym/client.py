"""Async OpenEnv client for the BrowserGym MiniWoB++ server.

openenv-core 0.3 clients are async (``await env.reset()``); ``.sync()`` gives the
blocking wrapper that eval-protocol's OpenEnvRolloutProcessor needs, since it
calls ``env.reset()``/``env.step()``/``env.close()`` without awaiting.
Each client is one WebSocket session, i.e. one browser on the server.
"""

import logging
from collections.abc import Callable, Mapping
from typing import Any, Optional

from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect

from ep_trl.envs.browsergym.models import BrowserGymAction, BrowserGymObservation, BrowserGymState

logger = logging.getLogger(__name__)

#: Per-reply timeout; a reset launches Chromium (~2 s, more under load on 2 cores).
DEFAULT_REQUEST_TIMEOUT_S = 60.0


class BrowserGymEnv(EnvClient[BrowserGymAction, BrowserGymObservation, BrowserGymState]):
    """WebSocket client for one BrowserGym session.

    ``reset`` forwards keyword arguments to the server (``task_name``, ``seed``,
    ``screenshot``, ``episode_id``). ``step`` takes a ``BrowserGymAction`` or a
    plain action string.
    """

    #: openenv's EnvClient sets it (None until connected); openenv ships no type information.
    _ws: Optional[ClientConnection]

    def __init__(
        self,
        base_url: str,
        *,
        task_name: Optional[str] = None,
        screenshot: Optional[bool] = None,
        request_timeout_s: Optional[float] = None,
        default_headers: Optional[Mapping[str, str]] = None,
        seeds: Optional[Callable[[Optional[str]], int]] = None,
        **kwargs: Any,
    ) -> None:
        """Create the client (no connection is made until the first call).

        ``request_timeout_s`` and ``default_headers`` exist because
        eval-protocol's OpenEnvRolloutProcessor (env_client_cls path) calls
        ``cls(base_url=..., request_timeout_s=..., default_headers=...)``: the
        timeout becomes openenv's per-reply ``message_timeout_s``, the headers
        are sent with the WebSocket handshake. ``task_name``/``screenshot`` are
        defaults for every ``reset`` that does not name its own, so callers that
        reset without arguments (eval-protocol does) still pick a task per client.
        ``seeds``, called with the reset's task name at each reset that names no
        ``seed``, picks the MiniWoB instance (e.g. a
        ``ep_trl.devtools.miniwob_instances.SeedSource``: training and held-out
        instances kept apart); without it the server draws one at random.
        Other keyword arguments go to ``EnvClient``.
        """
        timeout = DEFAULT_REQUEST_TIMEOUT_S if request_timeout_s is None else float(request_timeout_s)
        kwargs.setdefault("message_timeout_s", timeout)
        super().__init__(base_url=base_url, **kwargs)
        self._default_headers = dict(default_headers or {})
        self._reset_defaults: dict[str, Any] = {}
        if task_name is not None:
            self._reset_defaults["task_name"] = task_name
        if screenshot is not None:
            self._reset_defaults["screenshot"] = bool(screenshot)
        self._seeds = seeds

    async def connect(self) -> "BrowserGymEnv":
        """Open the WebSocket, sending ``default_headers`` when there are any.

        Without headers openenv's own connect is used unchanged; with headers the
        handshake is made here because openenv's connect takes none.
        """
        if not self._default_headers:
            await super().connect()
            return self
        if self._ws is not None:
            return self
        url = self._ws_url.lower()
        local = "localhost" in url or "127.0.0.1" in url
        try:
            self._ws = await ws_connect(
                self._ws_url,
                open_timeout=self._connect_timeout,
                max_size=self._max_message_size,
                additional_headers=self._default_headers,
                proxy=None if local else True,
            )
        except Exception as exc:
            raise ConnectionError(f"Failed to connect to {self._ws_url}: {exc}") from exc
        return self

    async def reset(self, **kwargs: Any) -> StepResult[BrowserGymObservation]:
        """Start an episode; explicit kwargs override the constructor's defaults."""
        arguments = {**self._reset_defaults, **kwargs}
        if self._seeds is not None and arguments.get("seed") is None:
            arguments["seed"] = self._seeds(arguments.get("task_name"))
        return await super().reset(**arguments)

    def _step_payload(self, action: BrowserGymAction | str) -> dict[str, Any]:
        """Serialize the action (a bare string is wrapped) with its metadata."""
        if isinstance(action, str):
            action = BrowserGymAction(action_str=action)
        return action.model_dump()

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[BrowserGymObservation]:
        """Rebuild the observation, putting back reward/done that the server sends beside it.

        ``metadata`` is a copy of ``info`` because openenv's server drops
        metadata on the wire, and callers reasonably look there.
        """
        data = dict(payload.get("observation", {}))
        reward = payload.get("reward")
        done = bool(payload.get("done", False))
        observation = BrowserGymObservation(**data, reward=reward, done=done, metadata=dict(data.get("info", {})))
        return StepResult(observation=observation, reward=reward, done=done)

    def _parse_state(self, payload: dict[str, Any]) -> BrowserGymState:
        """State as the server reports it."""
        return BrowserGymState.model_validate(payload)
