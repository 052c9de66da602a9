"""A letters client that records what the bridge does with each environment session (reuse, close)."""

from typing import TYPE_CHECKING, Any

from ep_trl.envs.letters import LettersEnv

if TYPE_CHECKING:
    from openenv.core.client_types import StepResult

    from ep_trl.envs.letters import LettersAction, LettersObservation


class TrackedLettersEnv(LettersEnv):
    """A letters client that records what was done with it, in order (``clients`` lists every one built)."""

    clients: list["TrackedLettersEnv"] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.events: list[str] = []
        type(self).clients.append(self)

    async def reset(self, **kwargs: Any) -> "StepResult[LettersObservation]":
        self.events.append("reset")
        return await super().reset(**kwargs)

    async def step(self, action: "LettersAction", **kwargs: Any) -> "StepResult[LettersObservation]":
        try:
            return await super().step(action, **kwargs)
        except Exception:
            self.events.append("crash")
            raise

    async def close(self) -> None:
        self.events.append("close")
        await super().close()
