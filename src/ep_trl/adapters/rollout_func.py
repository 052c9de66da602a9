"""``create_openenv_vllm_rollout_func``: an eval-protocol eval test as a TRL ``rollout_func``.

This module holds the factory, the parts the episode stream runs on (source, backend, loop, log) and the
``rollout_func`` adapter: a call's prompt groups played through :func:`ep_trl.engine.stream.play_groups` and collected into
TRL's dict (the other adapter, for ``AsyncGRPOTrainer``, is :mod:`ep_trl.adapters.async_worker`). Who calls is
:mod:`ep_trl.engine.caller`, what a call reads from it is :mod:`ep_trl.engine.call_setup`, one episode is :mod:`ep_trl.openenv.loop`,
scoring is :mod:`ep_trl.engine.scoring`, the returned dict is :mod:`ep_trl.adapters.output`.
"""

import logging
import os
import time
from collections.abc import AsyncGenerator, Callable, Coroutine, Iterator, Sequence
from contextlib import aclosing
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar

from ..openenv import servers as env_servers
from .. import evalprotocol
from ..engine import settings
from ..runtime import shutdown
from . import trl_seam
from ..engine.call_setup import CallReader, CallSetup
from ..engine.caller import GroupNumbers, RolloutCaller
from ..openenv.servers import LaunchedServers
from ..sources.episode import Episode
from ..errors import ConfigError
from ..evalprotocol import EvalSpec, EvalTest
from ..generation.vllm import probe_server
from ..engine.metrics import SignalWatch, budget_warning, call_metrics, summary_line
from ..options import Backend, EvalOverrides, RolloutOptions, VLLMOptions, check_keywords, refuse_unknown
from .output import trl_output
from ..traininglog.writer import RolloutLogWriter
from ..runtime.runner import LoopRunner
from ..engine.scoring import Scored, group_indices
from ..sources import EpisodePlayer, EpisodeSource
from ..sources.choice import make_source
from ..engine.stream import AllScope, GroupPlan, PlayedEpisode, ScoredGroup, SlotMeter, play_groups
from ..trajectory.types import Prompt

if TYPE_CHECKING:  # built by the sharded adapter, which imports this module
    from .sharded import ShardedRolloutFunction

logger = logging.getLogger(__name__)

T = TypeVar("T")


class RolloutFunction:
    """The callable handed to ``GRPOTrainer(rollout_func=...)``; also closable (``close()``) and inspectable."""

    def __init__(self, spec: EvalSpec, source: EpisodeSource, *, backend: Backend = "auto",
                 vllm_base_url: str | None = None, max_episode_tokens: int | None = None,
                 vllm: VLLMOptions | None = None, options: RolloutOptions | None = None,
                 log_writer: RolloutLogWriter | None = None) -> None:
        self.spec = spec
        self.source = source
        self.backend = backend
        self.options = options or RolloutOptions()
        self._runner = LoopRunner()
        self._log = log_writer
        self.invocation_id = evalprotocol.new_id("ep-trl")
        self._reader = CallReader(spec, backend=backend, vllm_base_url=vllm_base_url, vllm=vllm or VLLMOptions(),
                                  chat_template_kwargs=self.options.chat_template_kwargs,
                                  max_episode_tokens=max_episode_tokens, invocation_id=self.invocation_id,
                                  log=log_writer)
        self._player: EpisodePlayer | None = None
        self._group_numbers = GroupNumbers()
        self._signal = SignalWatch(self.options.max_signal_free_calls, spec.qualified_name)
        self.calls = 0
        self.__name__ = f"ep_trl_rollout[{spec.qualified_name}]"
        self._owner = os.getpid()  # what it holds is this process's: a forked child owns none of it
        shutdown.register(self, self.options.stop_grace_s)  # closed at exit, on SIGTERM too, unless closed before

    def __call__(self, prompts: Sequence[Prompt], *trainer_args: Any) -> dict[str, list[Any]]:
        """``rollout_func(prompts, trainer)`` as ``GRPOTrainer`` calls it."""
        caller = trl_seam.caller_of(trainer_args)
        caller.wait_for_weight_sync()  # multi-process: no request before the main process pushed new weights
        return self.run(prompts, caller)

    def run(self, prompts: Sequence[Prompt], caller: RolloutCaller, first_group: int | None = None) -> dict[str, list[Any]]:
        """One rollout call for ``prompts`` from ``caller`` (what ``__call__`` does for the ``GRPOTrainer`` it is
        handed). ``first_group`` is the run-wide number of its first prompt group when another process counts them (a
        worker process's shard); by default this function counts its own calls."""
        if not prompts:
            raise ValueError("rollout_func was called with no prompts")
        shutdown.raise_if_terminating()  # a SIGTERM whose first raise some code swallowed: no new call starts
        return self._runner.run(self._rollout(list(prompts), caller, first_group))

    @property
    def backend_name(self) -> str:
        generator = self._reader.generator
        return generator.name if generator is not None else self.backend

    @property
    def log_writer(self) -> RolloutLogWriter | None:
        """The writer of this function's rows to eval-protocol's store (its ``queued`` and ``failures`` counts say
        how many row updates were handed to it and how many could not be written); None with
        ``log_rollouts=False``. Read only: ``flush_logs()`` and ``close()`` drive it."""
        return self._log

    def flush_logs(self) -> None:
        """Wait until every rollout row so far is in the eval-protocol store."""
        if self._log is not None:
            self._log.flush()

    def close(self) -> None:
        """Cancel a call still in flight in another thread (a rollout worker stopping), write the remaining log rows,
        release the generation backend and the episode source (environment servers ep_trl started, the
        processor's endpoint) and the background loop. In a forked child it releases nothing: all of it is the
        parent's."""
        if os.getpid() != self._owner:
            logger.debug("not closing process %d's rollout function from its child %d", self._owner, os.getpid())
            return
        self._runner.cancel_pending()
        if self._log is not None:
            self._log.close()
        try:
            self._runner.run(self._reader.aclose())
            self._runner.run(self.source.aclose())
        finally:
            self._runner.close()
            shutdown.unregister(self)

    def setup(self, caller: RolloutCaller) -> CallSetup:
        """What a call (or a stream) started now needs from ``caller``, read once (``ep_trl.engine.call_setup``)."""
        return self._reader.read(caller)

    def run_async(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the rollout function's event loop (where its generator, sessions and endpoint live) and
        wait for it: the rollout worker's stream runs there."""
        return self._runner.run(coro)

    async def groups(self, caller: RolloutCaller, plans: Iterator[GroupPlan],
                     **stream: Any) -> AsyncGenerator[ScoredGroup, None]:
        """:meth:`play` with what ``caller`` offers, read once as the stream starts."""
        async with aclosing(self.play(self.setup(caller), plans, **stream)) as played:
            async for group in played:
                yield group
                del group  # not kept (its episodes' images) while the next group plays

    async def play(self, setup: CallSetup, plans: Iterator[GroupPlan], *, slots: int, all_scope: AllScope = "group",
                   may_start: Callable[[], bool] | None = None, turn_version: Callable[[], int] | None = None,
                   model_for: Callable[[int], str | None] | None = None, meter: SlotMeter | None = None,
                   max_episode_images: int | None = None) -> AsyncGenerator[ScoredGroup, None]:
        """The stream core (``ep_trl.engine.stream.play_groups``) on this eval's source and ``setup``: ``plans`` played with
        at most ``slots`` episodes in flight, each group yielded once complete and scored."""
        generator = setup.generator
        await generator.begin_call()  # forgets an earlier call's failure (the server may be back), wakes an engine
        try:
            async with self.source.session(setup) as player:
                self._player = player
                stream = play_groups(player, self.spec, plans, generator, slots=slots,
                                     body_timeout_s=self.options.body_timeout_s, all_scope=all_scope,
                                     may_start=may_start, turn_version=turn_version, model_for=model_for, meter=meter,
                                     max_episode_images=max_episode_images)
                async with aclosing(stream):  # closed (its episodes cancelled) before the sessions are
                    async for group in stream:
                        yield group
                        del group  # not kept (its episodes' images) while the next group plays
        finally:
            await generator.end_call()

    def log_final(self, group: ScoredGroup) -> None:
        """Log a released group's scored rows with their token views (nothing when logging is off)."""
        if self._log is not None:
            group.plan.context.log_final(self._log, group.episodes, list(group.scored), group.seconds)

    def observe_signal(self, episodes: list[Episode], scored: list[Scored]) -> None:
        """Count episodes without a score (``RolloutOptions.max_signal_free_calls`` such rounds in a row raise)."""
        self._signal.observe(episodes, scored)

    @property
    def env_sessions(self) -> int:
        """Environment sessions opened by the stream now playing, or by the last one."""
        return self._player.env_sessions if self._player is not None else 0

    async def _rollout(self, prompts: Sequence[Prompt], caller: RolloutCaller,
                       first_group: int | None) -> dict[str, list[Any]]:
        started = time.perf_counter()
        self.calls += 1
        setup = self.setup(caller)
        self.source.check(prompts)
        groups = group_indices(prompts, caller.config.num_generations)
        first = self._group_numbers.first(caller, len(groups)) if first_group is None else first_group
        rollout_ids = [evalprotocol.new_id("rollout") for _ in prompts]
        plans = iter([GroupPlan(group=first + g, prompt=prompts[members[0]], indices=tuple(members),
                                rollout_ids=tuple(rollout_ids[i] for i in members), context=setup.context)
                      for g, members in enumerate(groups)])
        played: dict[int, PlayedEpisode] = {}
        verdicts: dict[int, Scored] = {}
        stream = self.play(setup, plans, slots=self.spec.max_concurrent_rollouts, all_scope="stream")
        async with aclosing(stream):  # an error here cancels the episodes in flight before it goes on
            async for group in stream:
                for episode, verdict in zip(group.played, group.scored):
                    played[episode.request.index] = episode
                    verdicts[episode.request.index] = verdict
        episodes = [played[i].episode for i in range(len(prompts))]
        scored = [verdicts[i] for i in range(len(prompts))]
        seconds = time.perf_counter() - started
        if self._log is not None:
            setup.context.log_final(self._log, episodes, scored, seconds)
        metrics = call_metrics(episodes, scored, seconds, self.env_sessions)
        caller.record_metrics(metrics)
        logger.info(summary_line(setup.context.step, episodes, scored, seconds, metrics))
        budget = budget_warning(episodes, setup.limits.max_episode_tokens)
        if budget:
            logger.warning(budget)
        self._signal.observe(episodes, scored)
        return trl_output(episodes, scored, rollout_ids, setup.limits.stop_token_ids[0])


def create_openenv_vllm_rollout_func(
    env_path: str,
    *,
    backend: Backend = "auto",
    vllm_base_url: str | None = None,
    env_base_url: str | None = None,
    env_factory: Callable[[], Any] | None = None,
    max_concurrent_rollouts: int | None = None,
    max_episode_tokens: int | None = None,
    log_rollouts: bool = True,
    provider: Any | None = None,
    overrides: EvalOverrides | None = None,
    vllm: VLLMOptions | None = None,
    options: RolloutOptions | None = None,
    **unknown: Any,
) -> "RolloutFunction | ShardedRolloutFunction":
    """Build a TRL ``rollout_func`` that plays the eval's episodes and scores them with the eval's body.

    An ``OpenEnvRolloutProcessor`` eval's environment loop is played by ep_trl itself; any other processor runs
    unchanged on the eval's rows with its model calls captured (docs/processors.md). Build the training dataset
    with ``dataset_from_eval(env_path)`` so each prompt finds its eval row again.

    Args:
        env_path: ``"pkg.module::test_name"``, ``"pkg.module"`` (its only eval test) or ``"path/to/eval.py::test_name"``.
        backend: ``"trainer"`` samples in-process with ``trainer.model``; ``"vllm"`` uses a vLLM server (the trainer's
            when ``GRPOConfig(use_vllm=True, vllm_mode="server")``, else ``vllm_base_url``); ``"auto"`` picks vllm when
            either is available, trainer otherwise.
        vllm_base_url: the root URL of a vLLM server (``http://host:8000``) to generate with when the trainer has
            none of its own. Nothing pushes the trainer's weights there, so rollouts are off-policy after the first
            optimizer step (docs/vllm.md).
        env_base_url: an environment server that is already running (replaces the eval's environment source;
            OpenEnv evals only, as are ``env_factory`` and ``provider``).
        env_factory: builds one environment client per episode (replaces the eval's).
        max_concurrent_rollouts: episodes run at once (default: the eval's ``max_concurrent_rollouts``).
        max_episode_tokens: completion tokens per episode (sampled and inserted); defaults to the GRPOConfig's
            ``max_completion_length``. TRL does not truncate rollout output, so the episode stops when it is spent.
        log_rollouts: write every training rollout to eval-protocol's dataset logger, the store ``ep logs`` shows
            (running, after each step, then scored). eval-protocol's ``DISABLE_EP_SQLITE_LOG=1`` also turns it off.
        provider: an OpenEnv runtime or container provider (or a zero-argument callable making one per task) that
            starts the eval's environment server. Without it, an eval that names a Docker image or hub repo and
            no URL gets its server started locally from its package (``ep_trl.openenv.servers``); the servers stop
            when the rollout function is closed or the process exits.
        overrides: :class:`~ep_trl.options.EvalOverrides`, settings that replace the eval's own.
        vllm: :class:`~ep_trl.options.VLLMOptions` for the vLLM backend (timeouts, retries, batching, seed).
        options: :class:`~ep_trl.options.RolloutOptions` (chat template kwargs, session reuse, log store).

    Returns:
        A callable ``rollout_func(prompts, trainer)`` whose output holds ``prompt_ids``, ``completion_ids``,
        ``logprobs``, ``env_mask``, ``eval_score``, ``step_rewards``, ``num_turns``, ``episode_status``,
        ``template_realigned`` and ``rollout_id`` (the row's id in ``ep logs``), one entry per prompt, in order.
    """
    refuse_unknown(unknown)
    check_keywords(backend, vllm_base_url, max_episode_tokens, log_rollouts, overrides, vllm, options)
    vllm, options = vllm or VLLMOptions(), options or RolloutOptions()
    trl_seam.check_version()
    evalprotocol.check_version()
    if options.worker_processes > 1:
        from .sharded import sharded_rollout_func

        return sharded_rollout_func(env_path, options.worker_processes, create_openenv_vllm_rollout_func, dict(
            backend=backend, vllm_base_url=vllm_base_url, env_base_url=env_base_url, env_factory=env_factory,
            max_concurrent_rollouts=max_concurrent_rollouts, max_episode_tokens=max_episode_tokens,
            log_rollouts=log_rollouts, provider=provider, overrides=overrides, vllm=vllm, options=options))
    merged = (overrides or EvalOverrides()).merged(env_base_url=env_base_url, env_factory=env_factory,
                                                   max_concurrent_rollouts=max_concurrent_rollouts)
    eval_test = evalprotocol.resolve_eval_test(env_path)
    spec, servers = _resolve(eval_test, merged, provider)
    source = make_source(spec, eval_test, options, servers)
    for note in settings.notes(spec):
        logger.info(note)
    logger.info("ep_trl: training on %s (mode %s): %s", spec.qualified_name, spec.mode, source.describe())
    if vllm_base_url and backend != "trainer":
        probe_server(vllm_base_url, vllm.connect_timeout_s)  # an unreachable server fails now, not mid-training
    writer = RolloutLogWriter(evalprotocol.make_dataset_logger(options.log_home)) if log_rollouts else None
    return RolloutFunction(spec, source, backend=backend,
                           vllm_base_url=vllm_base_url.rstrip("/") if vllm_base_url else None,
                           max_episode_tokens=max_episode_tokens, vllm=vllm, options=options, log_writer=writer)


#: The same factory under a name that does not suggest OpenEnv or vLLM: it trains evals with any processor.
create_rollout_func = create_openenv_vllm_rollout_func


def _resolve(eval_test: EvalTest, overrides: EvalOverrides,
             provider: Any | None) -> tuple[EvalSpec, LaunchedServers | None]:
    """The eval's spec with the overrides applied and checked, its environment servers started if ep_trl must."""
    spec = settings.apply_overrides(evalprotocol.read_eval_spec(eval_test), overrides)
    if spec.env is None:
        if provider is not None:
            raise ConfigError(f"provider= starts OpenEnv environment servers; {spec.qualified_name} uses "
                              f"{spec.processor_name}, which brings its own environment.")
        return spec, None
    if provider is None and not spec.env.needs_launch():
        return spec, None
    launched_env, servers = env_servers.launch(spec.env, provider, overrides)
    spec = replace(spec, env=launched_env)
    settings.check_spec(spec)
    return spec, servers
