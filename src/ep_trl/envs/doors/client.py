"""Async OpenEnv client for the doors game (``.sync()`` for the blocking one eval-protocol's processor calls)."""

from collections.abc import Callable
from typing import Any, Optional

from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient

from ep_trl.envs.doors.models import DoorsAction, DoorsObservation, DoorsState


class DoorsEnv(EnvClient[DoorsAction, DoorsObservation, DoorsState]):
    """WebSocket client for one doors session.

    ``seeds``, when given, is called at each reset that names no seed and its value is the house drawn: a seed, or a
    ``(seed, wording)`` pair whose wording (a name in ``ep_trl.envs.doors.WORDINGS``) every sign of the house takes
    (a caller that builds its own environment factory hands out houses this way, e.g. with
    ``ep_trl.devtools.doors_houses.SeedSource``, since eval-protocol's processor resets without arguments; ``ep-trl
    train`` names seeds and wordings in the reset's arguments instead). Other keyword arguments go to OpenEnv's
    ``EnvClient``.

    Each observation's ``metadata`` is ``{"seed": ..., "wording": ...}``, the house it plays (openenv's server leaves
    ``metadata`` off the wire, so the client puts it back from the observation's fields): ep_trl records the reset's
    as the episode's ``instance``, in its row and in held-out results."""

    def __init__(
        self,
        base_url: str,
        *,
        seeds: Optional[Callable[[], int | tuple[int, Optional[str]]]] = None,
        rooms: Optional[int] = None,
        max_moves: Optional[int] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(base_url=base_url, **kwargs)
        self._seeds = seeds
        self._defaults = {k: v for k, v in (("rooms", rooms), ("max_moves", max_moves)) if v is not None}

    async def reset(self, **kwargs: Any) -> StepResult[DoorsObservation]:
        arguments = {**self._defaults, **kwargs}
        arguments.pop("task_name", None)  # the doors game has one task; a loop that rotates tasks may name it
        if self._seeds is not None and arguments.get("seed") is None:
            drawn = self._seeds()
            if isinstance(drawn, tuple):
                arguments["seed"], arguments["wording"] = drawn
            else:
                arguments["seed"] = drawn
        return await super().reset(**arguments)

    def _step_payload(self, action: DoorsAction) -> dict[str, Any]:
        return action.model_dump()

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[DoorsObservation]:
        reward = payload.get("reward")
        done = bool(payload.get("done", False))
        obs = DoorsObservation(**payload.get("observation", {}), reward=reward, done=done)
        obs.metadata = {"seed": obs.seed, "wording": obs.wording}
        return StepResult(observation=obs, reward=reward, done=done)

    def _parse_state(self, payload: dict[str, Any]) -> DoorsState:
        return DoorsState(**payload)
