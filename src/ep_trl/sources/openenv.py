"""Episodes of an ``OpenEnvRolloutProcessor`` eval, played by ep_trl itself: its environment, prompt builder and
action parser in ep_trl's token-exact loop (``ep_trl.episode``), on sessions from an ``EnvPool``."""

import asyncio
from collections.abc import Callable

from .. import settings
from ..env_pool import EnvPool, ServerNotes
from ..env_servers import LaunchedServers
from ..environment import check_openenv
from ..episode import Episode, EpisodeSpec, StepCallback, run_episode
from ..evalprotocol import EvalSpec
from ..options import RolloutOptions
from . import Batch, Played, gather_or_cancel


class OpenEnvSource:
    """Plays each prompt as one environment episode; task rotation per prompt group (``settings.plan_episodes``)."""

    def __init__(self, spec: EvalSpec, options: RolloutOptions, servers: LaunchedServers | None) -> None:
        assert spec.env is not None
        self._spec = spec
        self._options = options
        self._servers = servers
        self._notes = ServerNotes()
        self._openenv = check_openenv()  # exactly one supported OpenEnv distribution, or an error naming the fix

    def describe(self) -> str:
        env = self._spec.env
        assert env is not None
        return (f"{env.describe()} with {self._openenv}, {self._spec.max_steps} max steps, "
                f"tasks {list(env.tasks) or 'none'}")

    async def play(self, batch: Batch) -> Played:
        """Every episode of the call, at most ``max_concurrent_rollouts`` at once. An error that is not an
        episode's own cancels the others and raises; every environment session is closed either way."""
        spec = self._spec
        assert spec.env is not None
        cfg = settings.episode_config(spec, batch.limits)
        specs = settings.plan_episodes(batch.prompts, batch.groups, batch.first_group, spec.env.tasks,
                                       spec.completion_params.get("system_prompt"))
        limit = asyncio.Semaphore(spec.max_concurrent_rollouts)
        envs = EnvPool(cfg.env, reuse=self._options.reuse_env_sessions, notes=self._notes)
        on_step = [_step_logger(batch, s, r) for s, r in zip(specs, batch.rollout_ids)]

        async def bounded(episode: EpisodeSpec, callback: StepCallback | None) -> Episode:
            async with limit:
                return await run_episode(episode, cfg, batch.template, batch.generator, envs, callback)

        try:
            episodes = await gather_or_cancel([bounded(s, cb) for s, cb in zip(specs, on_step)])
        finally:
            await envs.aclose()
        rows = [batch.context.episode_row(ep, rid, batch.prompts[ep.spec.index])
                for ep, rid in zip(episodes, batch.rollout_ids)]
        return Played(episodes, rows, envs.opened)

    async def aclose(self) -> None:
        if self._servers is not None:
            self._servers.close()


def _step_logger(batch: Batch, spec: EpisodeSpec, rollout_id: str) -> Callable[..., None] | None:
    """Log the episode's row as it starts, and return a callback that logs it after every step (None when off)."""
    log, context = batch.log, batch.context
    if log is None:
        return None
    prompt = batch.prompts[spec.index]
    context.log_row(log, spec, rollout_id, prompt, spec.initial_messages, ())
    return lambda messages, rewards: context.log_row(log, spec, rollout_id, prompt, messages, rewards)
