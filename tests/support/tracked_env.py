"""A letters client that records what the bridge does with each environment session (reuse, close)."""

from ep_trl.envs.letters import LettersEnv


class TrackedLettersEnv(LettersEnv):
    """A letters client that records what was done with it, in order (``clients`` lists every one built)."""

    clients: list["TrackedLettersEnv"] = []

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.events: list[str] = []
        type(self).clients.append(self)

    async def reset(self, **kwargs):
        self.events.append("reset")
        return await super().reset(**kwargs)

    async def step(self, action, **kwargs):
        try:
            return await super().step(action, **kwargs)
        except Exception:
            self.events.append("crash")
            raise

    async def close(self) -> None:
        self.events.append("close")
        await super().close()
