"""Episodes of an ``OpenEnvRolloutProcessor`` eval, played by ep_trl itself: its environment, prompt builder and
action parser in ep_trl's token-exact loop (``ep_trl.openenv.loop``), on sessions from an ``EnvPool``."""

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager

from ..evalprotocol import EvalSpec
from ..evalprotocol.inputs import initial_messages
from ..generation import Generator
from ..options import RolloutOptions
from ..sources import CallSetup, EpisodeRequest
from ..trajectory.episode import Episode, EpisodePlan
from ..trajectory.types import Prompt, Row
from .client import check_openenv
from .episode import EpisodeConfig, episode_config, plan_episode
from .loop import run_episode
from .pool import EnvPool, ServerNotes
from .servers import LaunchedServers


class OpenEnvSource:
    """Plays each prompt as one environment episode; task rotation per prompt group (``episode.plan_episode``)."""

    def __init__(self, spec: EvalSpec, options: RolloutOptions, servers: LaunchedServers | None) -> None:
        assert spec.env is not None
        self._spec = spec
        self._options = options
        self._servers = servers
        self._notes = ServerNotes()
        self._openenv = check_openenv()  # exactly one supported OpenEnv distribution, or an error naming the fix

    @property
    def servers(self) -> LaunchedServers | None:
        """The environment servers ep_trl started for this eval (their ``providers``, ``urls`` by task and whether
        they are ``running``); None when the eval's environment has a URL or was given one. Read only: they stop
        with ``aclose()``."""
        return self._servers

    def describe(self) -> str:
        env = self._spec.env
        assert env is not None
        return (
            f"{env.describe()} with {self._openenv}, {self._spec.max_steps} max steps, "
            f"tasks {list(env.tasks) or 'none'}"
        )

    def check(self, prompts: Sequence[Prompt]) -> None:
        """Every prompt is a string or a list of chat messages (``episode.initial_messages`` says what is wrong)."""
        for index, prompt in enumerate(prompts):
            initial_messages(prompt, index)

    @asynccontextmanager
    async def session(self, setup: "CallSetup") -> AsyncIterator["_OpenEnvPlayer"]:
        """Environment sessions from one pool (reused between episodes when the options say so), all closed on
        exit."""
        spec = self._spec
        assert spec.env is not None
        envs = EnvPool(spec.env, reuse=self._options.reuse_env_sessions, notes=self._notes)
        try:
            yield _OpenEnvPlayer(spec, episode_config(spec, setup.limits), setup, envs)
        finally:
            await envs.aclose()

    async def first_observation(
        self, seed: int | None, task: str | None, extra: Mapping[str, object] | None = None
    ) -> str:
        """What the model would first be shown after ``reset(seed=seed)`` of ``task`` (with the keyword arguments
        ``extra``; the eval's prompt builder on the observation, else its text), on a session of its own, closed after:
        ``ep-trl train --held-out`` resets twice with one seed to check that the environment honours seeds, and once
        per value of ``--held-out-reset-kwarg``."""
        spec = self._spec
        assert spec.env is not None and spec.prompt_builder is not None
        envs = EnvPool(spec.env, reuse=False, notes=self._notes)
        label = f"reset check (task {task!r}, seed {seed}" + "".join(f", {k} {v!r}" for k, v in (extra or {}).items())
        session, outcome = await envs.start(label + ")", task, seed, extra)
        try:
            try:
                shown = spec.prompt_builder(outcome.observation, 1, [])
            except Exception:  # the loop shows str(observation) when the prompt builder raises; so does this
                shown = str(outcome.observation)
            return shown if isinstance(shown, str) else repr(shown)
        finally:
            await envs.release(session, reusable=False)
            await envs.aclose()

    async def aclose(self) -> None:
        if self._servers is not None:
            self._servers.close()


class _OpenEnvPlayer:
    def __init__(self, spec: EvalSpec, cfg: EpisodeConfig, setup: "CallSetup", envs: EnvPool) -> None:
        self._spec, self._cfg, self._setup, self._envs = spec, cfg, setup, envs

    @property
    def env_sessions(self) -> int:
        return self._envs.opened

    async def play(self, request: EpisodeRequest, generator: Generator) -> tuple[Episode, Row]:
        assert self._spec.env is not None
        plan = plan_episode(
            request.prompt,
            request.index,
            request.group,
            request.member,
            self._spec.env.tasks,
            self._spec.completion_params.get("system_prompt"),
            self._spec.env.reset_seed,
            self._spec.env.reset_kwargs,
        )
        episode = await run_episode(
            plan, self._cfg, self._setup.template, generator, self._envs, _step_logger(self._setup, request, plan)
        )
        return episode, request.context.episode_row(episode, request.rollout_id, request.prompt)


def _step_logger(setup: "CallSetup", request: EpisodeRequest, plan: EpisodePlan) -> Callable[..., None] | None:
    """Log the episode's row as it starts, and return a callback that logs it after every step (None when off)."""
    log, context = setup.log, request.context
    if log is None:
        return None
    rollout_id, prompt = request.rollout_id, request.prompt
    context.log_row(log, plan, rollout_id, prompt, plan.initial_messages, ())
    return lambda messages, rewards: context.log_row(log, plan, rollout_id, prompt, messages, rewards)
