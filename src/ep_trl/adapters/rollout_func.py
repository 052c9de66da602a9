"""``create_openenv_vllm_rollout_func``: an eval-protocol eval test as a TRL ``rollout_func``.

This module holds the factory and ``RolloutFunction``, the ``rollout_func`` adapter on a
:class:`~ep_trl.engine.engine.RolloutEngine`: a call's prompts become a finite plan of prompt groups, the engine plays
them, and the released groups are collected back into prompt order and TRL's dict (:mod:`ep_trl.adapters.output`).
The other adapters are :mod:`ep_trl.adapters.async_worker` (``AsyncGRPOTrainer``) and :mod:`ep_trl.adapters.sharded`
(shard processes, each with a ``RolloutFunction`` of its own).
"""

import logging
import time
from collections.abc import Sequence
from contextlib import aclosing
from typing import TYPE_CHECKING, Any

from .. import evalprotocol
from ..compat import refuse_unknown
from ..engine.caller import GroupNumbers, RolloutCaller
from ..engine.engine import RolloutEngine, build_engine
from ..engine.metrics import budget_warning, call_metrics, summary_line
from ..engine.scoring import group_indices
from ..engine.stream import GroupPlan, PlayedEpisode
from ..evalprotocol import EvalSpec
from ..evalprotocol.body import Scored
from ..evalprotocol.spec import EnvFactory
from ..openenv.servers import Provider
from ..options import Backend, EvalOverrides, RolloutOptions, VLLMOptions, check_keywords
from ..runtime import shutdown
from ..sources import CallSetup, EpisodeSource
from ..traininglog.writer import RolloutLogWriter
from ..trajectory.types import Prompt
from . import trl_seam
from .output import trl_output

if TYPE_CHECKING:  # built by the sharded adapter, which imports this module
    from trl import GRPOTrainer

    from ..trajectory.episode import Episode
    from .sharded import ShardedRolloutFunction

logger = logging.getLogger(__name__)


class RolloutFunction:
    """The callable handed to ``GRPOTrainer(rollout_func=...)``; also closable (``close()``) and inspectable. What it
    plays with is its ``engine`` (a :class:`~ep_trl.engine.engine.RolloutEngine`, closed with it); what it adds is
    the GRPO call: prompts to plans, groups to TRL's dict, the call's metrics."""

    def __init__(self, engine: RolloutEngine) -> None:
        self.engine = engine
        self._group_numbers = GroupNumbers()
        self.calls = 0
        self.__name__ = f"ep_trl_rollout[{engine.spec.qualified_name}]"

    def __call__(self, prompts: Sequence[Prompt], *trainer_args: "GRPOTrainer") -> dict[str, list[Any]]:
        """``rollout_func(prompts, trainer)`` as ``GRPOTrainer`` calls it."""
        caller = trl_seam.caller_of(trainer_args)
        caller.wait_for_weight_sync()  # multi-process: no request before the main process pushed new weights
        return self.run(prompts, caller)

    def run(
        self, prompts: Sequence[Prompt], caller: RolloutCaller, first_group: int | None = None
    ) -> dict[str, list[Any]]:
        """One rollout call for ``prompts`` from ``caller`` (what ``__call__`` does for the ``GRPOTrainer`` it is
        handed). ``first_group`` is the run-wide number of its first prompt group when another process counts them (a
        shard process's part of one); by default this function counts its own calls."""
        if not prompts:
            raise ValueError("rollout_func was called with no prompts")
        shutdown.raise_if_terminating()  # a SIGTERM whose first raise some code swallowed: no new call starts
        return self.engine.run(self._rollout(list(prompts), caller, first_group))

    # --- the engine's, read through (the names users and tests know) ---------------------------------------------

    @property
    def spec(self) -> EvalSpec:
        """The eval's spec (the engine's; setting it replaces the engine's)."""
        return self.engine.spec

    @spec.setter
    def spec(self, spec: EvalSpec) -> None:
        self.engine.spec = spec

    @property
    def source(self) -> EpisodeSource:
        return self.engine.source

    @property
    def backend(self) -> Backend:
        return self.engine.backend

    @property
    def options(self) -> RolloutOptions:
        return self.engine.options

    @property
    def invocation_id(self) -> str:
        return self.engine.invocation_id

    @property
    def backend_name(self) -> str:
        return self.engine.backend_name

    @property
    def log_writer(self) -> RolloutLogWriter | None:
        """The engine's writer of rows to eval-protocol's store (``RolloutEngine.log_writer``)."""
        return self.engine.log_writer

    @property
    def env_sessions(self) -> int:
        return self.engine.env_sessions

    def flush_logs(self) -> None:
        """Wait until every rollout row so far is in the eval-protocol store."""
        self.engine.flush_logs()

    def close(self) -> None:
        """Close the engine: a call still in flight cancelled, log rows written, backend, episode source and loop
        released (in a forked child, nothing: all of it is the parent's)."""
        self.engine.close()

    def play(
        self, prompts: Sequence[Prompt], caller: RolloutCaller, first_group: int | None = None
    ) -> "list[tuple[Episode, Scored]]":
        """Play and score ``prompts`` as one rollout call does, and return each episode with the eval's verdict, in
        prompt order, instead of TRL's dict; no metrics are handed to ``caller`` (``ep-trl train --held-out`` plays
        its held-out episodes with it)."""
        if not prompts:
            raise ValueError("play() was called with no prompts")
        shutdown.raise_if_terminating()
        _, episodes, scored, _ = self.engine.run(self._play(list(prompts), caller, first_group))
        return list(zip(episodes, scored))

    async def _rollout(
        self, prompts: Sequence[Prompt], caller: RolloutCaller, first_group: int | None
    ) -> dict[str, list[Any]]:
        started = time.perf_counter()
        self.calls += 1
        engine = self.engine
        setup, episodes, scored, rollout_ids = await self._play(prompts, caller, first_group)
        seconds = time.perf_counter() - started
        engine.log_final(setup.context, episodes, scored, seconds)
        metrics = call_metrics(episodes, scored, seconds, engine.env_sessions)
        caller.record_metrics(metrics)
        logger.info(summary_line(setup.context.step, episodes, scored, seconds, metrics))
        budget = budget_warning(episodes, setup.limits.max_episode_tokens)
        if budget:
            logger.warning(budget)
        engine.observe_signal(episodes, scored)
        return trl_output(episodes, scored, rollout_ids, setup.limits.stop_token_ids[0])

    async def _play(
        self, prompts: Sequence[Prompt], caller: RolloutCaller, first_group: int | None
    ) -> "tuple[CallSetup, list[Episode], list[Scored], list[str]]":
        engine = self.engine
        setup = engine.setup(caller)
        engine.check(prompts)
        groups = group_indices(prompts, caller.config.num_generations)
        first = self._group_numbers.first(caller, len(groups)) if first_group is None else first_group
        rollout_ids = [evalprotocol.new_id("rollout") for _ in prompts]
        plans = iter(
            [
                GroupPlan(
                    group=first + g,
                    prompt=prompts[members[0]],
                    indices=tuple(members),
                    rollout_ids=tuple(rollout_ids[i] for i in members),
                    context=setup.context,
                )
                for g, members in enumerate(groups)
            ]
        )
        played: dict[int, PlayedEpisode] = {}
        verdicts: dict[int, Scored] = {}
        stream = engine.stream(setup, plans, slots=engine.spec.max_concurrent_rollouts, all_scope="stream")
        async with aclosing(stream):  # an error here cancels the episodes in flight before it goes on
            async for group in stream:
                for episode, verdict in zip(group.played, group.scored):
                    played[episode.request.index] = episode
                    verdicts[episode.request.index] = verdict
        episodes = [played[i].episode for i in range(len(prompts))]
        return setup, episodes, [verdicts[i] for i in range(len(prompts))], rollout_ids


def create_openenv_vllm_rollout_func(
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
) -> "RolloutFunction | ShardedRolloutFunction":
    """Build a TRL ``rollout_func`` that plays the eval's episodes and scores them with the eval's body.

    An ``OpenEnvRolloutProcessor`` eval's environment loop is played by ep_trl itself; any other processor runs
    unchanged on the eval's rows with its model calls captured (docs/processors.md). Build the training dataset
    with ``dataset_from_eval(env_path)`` so each prompt finds its eval row again.

    Args:
        env_path: ``"pkg.module::test_name"``, ``"pkg.module"`` (its only eval test) or
        ``"path/to/eval.py::test_name"``. backend: ``"trainer"`` samples in-process with ``trainer.model``; ``"vllm"``
        uses a vLLM server (the trainer's
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
        ``template_realigned``, ``instance`` (what the environment's reset observation said the episode played, in
        its ``metadata``; None when it said nothing) and ``rollout_id`` (the row's id in ``ep logs``), one entry per
        prompt, in order.
    """
    refuse_unknown(unknown)
    check_keywords(backend, vllm_base_url, max_episode_tokens, log_rollouts, overrides, vllm, options)
    vllm, options = vllm or VLLMOptions(), options or RolloutOptions()
    keywords: dict[str, Any] = dict(
        backend=backend,
        vllm_base_url=vllm_base_url,
        env_base_url=env_base_url,
        env_factory=env_factory,
        max_concurrent_rollouts=max_concurrent_rollouts,
        max_episode_tokens=max_episode_tokens,
        log_rollouts=log_rollouts,
        provider=provider,
        overrides=overrides,
        vllm=vllm,
        options=options,
    )
    trl_seam.check_version()
    evalprotocol.check_version()
    if options.worker_processes > 1:
        from .sharded import sharded_rollout_func

        return sharded_rollout_func(env_path, options.worker_processes, create_openenv_vllm_rollout_func, keywords)
    return RolloutFunction(build_engine(env_path, **keywords))


#: The same factory under a name that does not suggest OpenEnv or vLLM: it trains evals with any processor.
create_rollout_func = create_openenv_vllm_rollout_func
