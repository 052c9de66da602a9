"""``RolloutEngine``: what every way of training plays its episodes with, built once from ``env_path`` by
:func:`build_engine`.

An engine holds the eval's spec, the episode source, the call reader (chat template and generation backend, built at
the first call), the event loop the episodes run on, the ``ep logs`` writer and the signal watch, and it closes them.
The adapters in ``ep_trl.adapters`` sit on top and use only the public methods below: ``RolloutFunction`` (GRPO's
``rollout_func``) turns a call's prompts into plans and the released groups into TRL's dict; ``EvalRolloutWorker``
(``AsyncGRPOTrainer``) plays an endless plan and turns groups into samples; the shard processes each build their
own ``RolloutFunction``. A new way to train is one adapter module on these methods (docs/architecture.md).
"""

import logging
import os
from collections.abc import AsyncGenerator, Callable, Coroutine, Iterator, Sequence
from contextlib import aclosing
from dataclasses import replace
from typing import Required, TypedDict, TypeVar, Unpack

from .. import evalprotocol
from ..compat import refuse_unknown
from ..errors import ConfigError
from ..evalprotocol import EvalSpec, EvalTest, eval_rows
from ..evalprotocol.body import Scored
from ..evalprotocol.spec import EnvFactory
from ..generation.probe import probe_server
from ..openenv import servers as env_servers
from ..openenv.servers import LaunchedServers, Provider
from ..options import Backend, EvalOverrides, RolloutOptions, VLLMOptions, check_keywords
from ..runtime import shutdown
from ..runtime.runner import LoopRunner
from ..sources import CallSetup, EpisodePlayer, EpisodeSource
from ..traininglog.rows import RowContext
from ..traininglog.writer import RolloutLogWriter
from ..trajectory.episode import Episode
from ..trajectory.types import Prompt, Row
from . import settings
from .call_setup import CallReader
from .caller import RolloutCaller
from .metrics import SignalWatch
from .stream import AllScope, GroupPlan, ScoredGroup, SlotMeter, stream_groups

logger = logging.getLogger(__name__)

T = TypeVar("T")


class StreamOptions(TypedDict, total=False):
    """The keywords of :meth:`RolloutEngine.stream` after ``setup`` and ``plans`` (what :meth:`RolloutEngine.groups`
    passes on)."""

    slots: Required[int]
    all_scope: AllScope
    may_start: Callable[[], bool] | None
    turn_version: Callable[[], int] | None
    model_for: Callable[[int], str | None] | None
    meter: SlotMeter | None
    max_episode_images: int | None


class RolloutEngine:
    """The eval's episodes played on its source with a caller's backend, on one event loop, logged and watched.

    Public: ``spec``, ``source``, ``backend``, ``options``, ``invocation_id`` (attributes); ``setup``, ``check``,
    ``run``, ``stream``, ``groups``, ``log_final``, ``observe_signal``, ``flush_logs``, ``close`` (methods);
    ``backend_name``, ``log_writer``, ``env_sessions`` (read-only properties). Closed at the process's exit (on
    SIGTERM too) unless closed before; in a forked child ``close()`` releases nothing (all of it is the parent's)."""

    def __init__(
        self,
        spec: EvalSpec,
        source: EpisodeSource,
        *,
        backend: Backend = "auto",
        vllm_base_url: str | None = None,
        max_episode_tokens: int | None = None,
        vllm: VLLMOptions | None = None,
        options: RolloutOptions | None = None,
        log_writer: RolloutLogWriter | None = None,
    ) -> None:
        self.spec = spec
        self.source = source
        self.backend = backend
        self.options = options or RolloutOptions()
        #: The id every ``ep logs`` row of this engine carries (``execution_metadata.invocation_id``).
        self.invocation_id = evalprotocol.new_id("ep-trl")
        self._runner = LoopRunner()
        self._log = log_writer
        self._reader = CallReader(
            spec,
            backend=backend,
            vllm_base_url=vllm_base_url,
            vllm=vllm or VLLMOptions(),
            chat_template_kwargs=self.options.chat_template_kwargs,
            max_episode_tokens=max_episode_tokens,
            invocation_id=self.invocation_id,
            log=log_writer,
        )
        self._player: EpisodePlayer | None = None
        self._signal = SignalWatch(self.options.max_signal_free_calls, spec.qualified_name)
        self._owner = os.getpid()  # what it holds is this process's: a forked child owns none of it
        shutdown.register(self, self.options.stop_grace_s)  # closed at exit, on SIGTERM too, unless closed before

    @property
    def backend_name(self) -> str:
        """The generation backend's name once a call built it (``"vllm"``, ``"trainer"``, ...), else ``backend``."""
        generator = self._reader.generator
        return generator.name if generator is not None else self.backend

    @property
    def log_writer(self) -> RolloutLogWriter | None:
        """The writer of the rows to eval-protocol's store (its ``queued`` and ``failures`` counts say how many row
        updates were handed to it and how many could not be written); None with ``log_rollouts=False``. Read only:
        ``flush_logs()`` and ``close()`` drive it."""
        return self._log

    @property
    def env_sessions(self) -> int:
        """Environment sessions opened by the stream now playing, or by the last one."""
        return self._player.env_sessions if self._player is not None else 0

    def setup(self, caller: RolloutCaller) -> CallSetup:
        """What a call (or a stream) started now needs from ``caller``, read once (``ep_trl.engine.call_setup``)."""
        return self._reader.read(caller)

    def check(self, prompts: Sequence[Prompt]) -> None:
        """Raise ``ConfigError`` for a prompt the eval's source cannot play (before any episode starts)."""
        self.source.check(prompts)

    def run(self, coro: Coroutine[object, object, T]) -> T:
        """Run ``coro`` on the engine's event loop (where its generator, sessions and endpoint live) and wait for it,
        from any thread but the loop's."""
        return self._runner.run(coro)

    async def stream(
        self,
        setup: CallSetup,
        plans: Iterator[GroupPlan],
        *,
        slots: int,
        all_scope: AllScope = "group",
        may_start: Callable[[], bool] | None = None,
        turn_version: Callable[[], int] | None = None,
        model_for: Callable[[int], str | None] | None = None,
        meter: SlotMeter | None = None,
        max_episode_images: int | None = None,
    ) -> AsyncGenerator[ScoredGroup, None]:
        """The stream core (``ep_trl.engine.stream.stream_groups``) on this eval's source and ``setup``: ``plans``
        played with at most ``slots`` episodes in flight, each group yielded once complete and scored. Run it on the
        engine's loop (``run``)."""
        generator = setup.generator
        await generator.begin_call()  # forgets an earlier call's failure (the server may be back), wakes an engine
        try:
            async with self.source.session(setup) as player:
                self._player = player
                stream = stream_groups(
                    player,
                    self.spec,
                    plans,
                    generator,
                    slots=slots,
                    body_timeout_s=self.options.body_timeout_s,
                    all_scope=all_scope,
                    may_start=may_start,
                    turn_version=turn_version,
                    model_for=model_for,
                    meter=meter,
                    max_episode_images=max_episode_images,
                )
                async with aclosing(stream):  # closed (its episodes cancelled) before the sessions are
                    async for group in stream:
                        yield group
                        del group  # not kept (its episodes' images) while the next group plays
        finally:
            await generator.end_call()

    async def groups(
        self, caller: RolloutCaller, plans: Iterator[GroupPlan], **stream: Unpack[StreamOptions]
    ) -> AsyncGenerator[ScoredGroup, None]:
        """:meth:`stream` with what ``caller`` offers, read once as the stream starts."""
        async with aclosing(self.stream(self.setup(caller), plans, **stream)) as played:
            async for group in played:
                yield group
                del group  # not kept (its episodes' images) while the next group plays

    def log_final(
        self, context: RowContext, episodes: Sequence[Episode], scored: Sequence[Scored], seconds: float
    ) -> None:
        """Log scored episodes' final rows with their token views under ``context`` (nothing when logging is off)."""
        if self._log is not None:
            context.log_final(self._log, episodes, list(scored), seconds)

    def observe_signal(self, episodes: Sequence[Episode], scored: Sequence[Scored]) -> None:
        """Count episodes without a score (``RolloutOptions.max_signal_free_calls`` such rounds in a row raise)."""
        self._signal.observe(list(episodes), list(scored))

    def flush_logs(self) -> None:
        """Wait until every row so far is in the eval-protocol store."""
        if self._log is not None:
            self._log.flush()

    def close(self) -> None:
        """Cancel a run still in flight in another thread (a rollout worker stopping), write the remaining log rows,
        release the generation backend and the episode source (environment servers ep_trl started, the
        processor's endpoint) and the event loop. In a forked child it releases nothing: all of it is the parent's."""
        if os.getpid() != self._owner:
            logger.debug("not closing process %d's rollout engine from its child %d", self._owner, os.getpid())
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


def build_engine(
    env_path: str,
    *,
    backend: Backend = "auto",
    vllm_base_url: str | None = None,
    env_base_url: str | None = None,
    env_factory: EnvFactory | None = None,
    max_concurrent_rollouts: int | None = None,
    max_episode_tokens: int | None = None,
    log_rollouts: bool = True,
    provider: Provider | None = None,
    overrides: EvalOverrides | None = None,
    vllm: VLLMOptions | None = None,
    options: RolloutOptions | None = None,
    **unknown: object,
) -> RolloutEngine:
    """The engine of the eval at ``env_path``: the keywords checked, the eval resolved with the overrides applied,
    environment servers started if ep_trl must, the episode source chosen, ``vllm_base_url`` probed, the log writer
    made. The keywords are ``create_openenv_vllm_rollout_func``'s (documented there) less ``worker_processes > 1``,
    which an adapter handles (``ep_trl.adapters.sharded``)."""
    refuse_unknown(unknown)
    check_keywords(backend, vllm_base_url, max_episode_tokens, log_rollouts, overrides, vllm, options)
    vllm, options = vllm or VLLMOptions(), options or RolloutOptions()
    evalprotocol.check_version()
    merged = (overrides or EvalOverrides()).merged(
        env_base_url=env_base_url, env_factory=env_factory, max_concurrent_rollouts=max_concurrent_rollouts
    )
    eval_test = evalprotocol.resolve_eval_test(env_path)
    spec, servers = _resolve(eval_test, merged, provider)
    source = make_source(spec, eval_test, options, servers, merged.input_dataset)
    for note in settings.notes(spec):
        logger.info(note)
    logger.info("ep_trl: training on %s (mode %s): %s", spec.qualified_name, spec.mode, source.describe())
    if vllm_base_url and backend != "trainer":
        probe_server(vllm_base_url, vllm.connect_timeout_s)  # an unreachable server fails now, not mid-training
    writer = RolloutLogWriter(evalprotocol.make_dataset_logger(options.log_home)) if log_rollouts else None
    return RolloutEngine(
        spec,
        source,
        backend=backend,
        vllm_base_url=vllm_base_url.rstrip("/") if vllm_base_url else None,
        max_episode_tokens=max_episode_tokens,
        vllm=vllm,
        options=options,
        log_writer=writer,
    )


def _resolve(
    eval_test: EvalTest, overrides: EvalOverrides, provider: Provider | None
) -> tuple[EvalSpec, LaunchedServers | None]:
    """The eval's spec with the overrides applied and checked, its environment servers started if ep_trl must."""
    spec = settings.apply_overrides(evalprotocol.read_eval_spec(eval_test), overrides)
    if spec.env is None:
        if provider is not None:
            raise ConfigError(
                f"provider= starts OpenEnv environment servers; {spec.qualified_name} uses "
                f"{spec.processor_name}, which brings its own environment."
            )
        return spec, None
    if provider is None and not spec.env.needs_launch():
        return spec, None
    launched_env, servers = env_servers.launch(spec.env, provider, overrides)
    spec = replace(spec, env=launched_env)
    settings.check_spec(spec)
    return spec, servers


def make_source(
    spec: EvalSpec,
    eval_test: EvalTest,
    options: RolloutOptions,
    servers: LaunchedServers | None,
    input_dataset: Sequence[str] | None = None,
) -> EpisodeSource:
    """ep_trl's own loop for an ``OpenEnvRolloutProcessor`` eval (``spec.env`` is set), else the eval's processor
    run on the eval's rows (read from ``input_dataset`` in place of the eval's own, when given)."""
    if spec.env is not None:
        from ..openenv.source import OpenEnvSource

        return OpenEnvSource(spec, options, servers)
    from ..sources.processor import ProcessorSource

    rows: list[Row] = eval_rows(eval_test, input_dataset)
    return ProcessorSource(spec, rows)
