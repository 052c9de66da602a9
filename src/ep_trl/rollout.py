"""``create_openenv_vllm_rollout_func``: an eval-protocol eval test as a TRL ``rollout_func``.

Precedence of settings, highest first:

1. keyword arguments of ``create_openenv_vllm_rollout_func``;
2. the eval test: its ``OpenEnvRolloutProcessor`` (environment, prompt builder, action parser, tasks), its first
   ``completion_params`` entry (``max_tokens``, ``stop``, ``system_prompt``), ``steps``,
   ``max_concurrent_rollouts`` and first ``evaluation_test_kwargs`` entry;
3. the ``GRPOConfig``: sampling temperature/top-p/top-k/min-p/repetition penalty always come from here (TRL's
   loss assumes them), and ``max_completion_length`` is the default episode token budget.
"""

import asyncio
import logging
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from . import evalprotocol, trl_compat
from .environment import EnvPool
from .episode import Episode, EpisodeConfig, EpisodeSpec, StepCallback, initial_messages, run_episode
from .errors import ConfigError
from .evalprotocol import EvalSpec
from .evaltest import resolve_eval_test
from .generation import Generator
from .rollout_log import RolloutLogWriter, make_dataset_logger
from .rows import RowContext
from .runner import LoopRunner
from .scoring import Scored, group_indices, score_rows
from .trainer_generation import TrainerGenerator
from .trajectory import ChatTemplate
from .vllm_server import VLLMServerGenerator, probe_server

logger = logging.getLogger(__name__)

Backend = Literal["auto", "trainer", "vllm"]
DEFAULT_MAX_TOKENS = 100  # OpenEnvRolloutProcessor's per-turn default when completion_params has none


@dataclass(frozen=True)
class Overrides:
    """Keyword arguments that replace the eval's own settings (None = keep the eval's)."""

    env_factory: Callable[[], Any] | None = None
    env_client_cls: type | None = None
    env_base_url: str | None = None
    request_timeout_s: float | None = None
    prompt_builder: Callable[[Any, int, list[str]], Any] | None = None
    action_parser: Callable[[str], Any] | None = None
    tasks: Sequence[str] | None = None
    task_var: str | None = None
    reset_task_kwarg: str | None = None
    max_steps: int | None = None
    max_tokens: int | None = None
    stop: Sequence[str] | None = None
    max_concurrent_rollouts: int | None = None
    evaluation_test_kwargs: Mapping[str, Any] | None = None

    def apply(self, spec: EvalSpec) -> EvalSpec:
        env = spec.env
        env_changes: dict[str, Any] = {}
        if self.env_factory is not None:
            env_changes["factory"] = self.env_factory
        if self.env_client_cls is not None or self.env_base_url is not None:
            env_changes["factory"] = None  # an explicit client/url replaces the eval's factory
            if self.env_client_cls is not None:
                env_changes["client_cls"] = self.env_client_cls
            if self.env_base_url is not None:
                env_changes["base_url"] = self.env_base_url
        for name, field_name in (("request_timeout_s", "request_timeout_s"), ("task_var", "task_var"),
                                 ("reset_task_kwarg", "reset_task_kwarg")):
            value = getattr(self, name)
            if value is not None:
                env_changes[field_name] = value
        if self.tasks is not None:
            env_changes["tasks"] = tuple(str(t) for t in self.tasks)
        env = replace(env, **env_changes)
        params = dict(spec.completion_params)
        if self.max_tokens is not None:
            params["max_tokens"] = int(self.max_tokens)
        if self.stop is not None:
            params["stop"] = list(self.stop)
        return replace(
            spec,
            env=env,
            completion_params=params,
            prompt_builder=self.prompt_builder or spec.prompt_builder,
            action_parser=self.action_parser or spec.action_parser,
            max_steps=int(self.max_steps) if self.max_steps is not None else spec.max_steps,
            max_concurrent_rollouts=(int(self.max_concurrent_rollouts) if self.max_concurrent_rollouts is not None
                                     else spec.max_concurrent_rollouts),
            evaluation_test_kwargs=(dict(self.evaluation_test_kwargs) if self.evaluation_test_kwargs is not None
                                    else spec.evaluation_test_kwargs),
        )


class RolloutFunction:
    """The callable handed to ``GRPOTrainer(rollout_func=...)``; also closable (``close()``) and inspectable."""

    def __init__(self, spec: EvalSpec, backend: Backend, vllm_base_url: str | None,
                 max_episode_tokens: int | None, chat_template_kwargs: Mapping[str, Any] | None,
                 trainer_signature: bool, vllm_options: Mapping[str, Any],
                 log_writer: RolloutLogWriter | None = None, reuse_env_sessions: bool = True) -> None:
        self.spec = spec
        self.backend = backend
        self.vllm_base_url = vllm_base_url
        self.max_episode_tokens = max_episode_tokens
        self._chat_template_kwargs = dict(chat_template_kwargs or {})
        self._trainer_signature = trainer_signature
        self._vllm_options = dict(vllm_options)
        self.reuse_env_sessions = reuse_env_sessions
        self._runner = LoopRunner()
        self._log = log_writer
        self._generator: Generator | None = None
        self._template: ChatTemplate | None = None
        self._groups_started = 0
        self.calls = 0
        self.invocation_id = evalprotocol.new_id("ep-trl")
        self.__name__ = f"ep_trl_rollout[{spec.qualified_name}]"

    # TRL >= 0.26: (prompts, trainer); older: (prompts, args, processing_class)
    def __call__(self, prompts: list[Any], *trainer_args: Any) -> dict[str, list[Any]]:
        view = trl_compat.view_from_call(trainer_args, self._trainer_signature)
        if not prompts:
            raise ValueError("rollout_func was called with no prompts")
        if self.backend != "trainer":
            view.wait_for_weight_sync()  # multi-process: no request before the main process pushed new weights
        return self._runner.run(self._rollout(list(prompts), view))

    @property
    def backend_name(self) -> str:
        return self._generator.name if self._generator is not None else self.backend

    def flush_logs(self) -> None:
        """Wait until every rollout row so far is in the eval-protocol store."""
        if self._log is not None:
            self._log.flush()

    def close(self) -> None:
        """Write the remaining log rows, release the generation backend and the background loop."""
        if self._log is not None:
            self._log.close()
        if self._generator is not None:
            self._runner.run(self._generator.aclose())
            self._generator = None
        self._runner.close()

    def _setup(self, view: trl_compat.TrainerView) -> tuple[ChatTemplate, Generator]:
        if self._template is None:
            self._template = ChatTemplate(view.processing_class, self._chat_template_kwargs)
            self._warn_sampling_mismatch(view)
        if self._generator is None:
            self._generator = self._make_generator(view)
        return self._template, self._generator

    def _make_generator(self, view: trl_compat.TrainerView) -> Generator:
        """The trainer's own vLLM server when it has one (TRL pushes weights there before each call), else
        ``vllm_base_url`` (no weight sync: off-policy after the first optimizer step), else the trainer's model."""
        explicit = self.vllm_base_url.rstrip("/") if self.vllm_base_url else None
        server_url = view.vllm_server_url() if self.backend != "trainer" else None
        choice = self.backend
        if choice == "auto":
            choice = "vllm" if (explicit or server_url) else "trainer"
        if choice == "vllm":
            url = server_url or explicit
            if url is None:
                raise ConfigError(
                    "backend='vllm' needs a server: train with GRPOConfig(use_vllm=True, vllm_mode='server') "
                    "or pass vllm_base_url='http://HOST:PORT'."
                )
            if server_url and explicit and explicit != server_url.rstrip("/"):
                logger.warning(
                    "vllm_base_url=%s is ignored: the trainer generates with use_vllm=True and pushes its weights to "
                    "%s, so ep_trl generates there too.", explicit, server_url)
            if not server_url:
                logger.warning(
                    "Generating with the vLLM server at %s, which this trainer does not push weights to: rollouts are "
                    "off-policy after the first optimizer step (and TRL applies no importance-sampling correction "
                    "with use_vllm=False). Keep the server in sync with GRPOConfig(use_vllm=True, "
                    "vllm_mode='server') on GPUs, or ep_trl.vllm_weight_sync.DiskSyncGRPOTrainer on CPU "
                    "(docs/vllm.md).", url)
            options = dict(self._vllm_options)
            if self.spec.max_concurrent_rollouts <= 1:
                options["batch_window_s"] = 0.0  # one episode at a time: no other turn will ever join a batch
            generator: Generator = VLLMServerGenerator(url, model=view.vllm_server_model() if server_url else None,
                                                       **options)
        else:
            provider = view.model_provider()
            model = provider()
            tokenizer = getattr(view.processing_class, "tokenizer", view.processing_class)
            pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
            generator = TrainerGenerator(provider, tokenizer, trl_compat.eos_token_ids(view.processing_class, model), pad)
        logger.info("ep_trl: %s generates for %s", generator.name, self.spec.qualified_name)
        return generator

    def _warn_sampling_mismatch(self, view: trl_compat.TrainerView) -> None:
        trainer_sampling = view.sampling()
        asked = {k: self.spec.completion_params[k] for k in ("temperature", "top_p", "top_k")
                 if k in self.spec.completion_params}
        used = {"temperature": trainer_sampling.temperature, "top_p": trainer_sampling.top_p,
                "top_k": trainer_sampling.top_k}
        differing = {k: v for k, v in asked.items() if v is not None and float(v) != float(used[k])}
        if differing:
            logger.info(
                "%s asks for %s; training samples with the GRPOConfig's %s because TRL's loss and importance "
                "ratio assume them.", self.spec.qualified_name, differing, {k: used[k] for k in differing})

    def _episode_config(self, view: trl_compat.TrainerView, generator: Generator) -> EpisodeConfig:
        params = self.spec.completion_params
        budget = self.max_episode_tokens or view.max_completion_length
        if not budget:
            raise ConfigError("No episode token budget: set GRPOConfig(max_completion_length=...) or max_episode_tokens=...")
        model = view.model_provider()() if isinstance(generator, TrainerGenerator) else None
        stop_ids = tuple(int(t) for t in params.get("stop_token_ids") or ())
        eos = trl_compat.eos_token_ids(view.processing_class, model)
        sampling = replace(
            view.sampling(),
            max_tokens=int(params.get("max_tokens") or DEFAULT_MAX_TOKENS),
            stop=tuple(params.get("stop") or ()) if not isinstance(params.get("stop"), str) else (params["stop"],),
            stop_token_ids=stop_ids,
        )
        max_len = getattr(getattr(model, "config", None), "max_position_embeddings", None) if model is not None \
            else getattr(generator, "max_model_len", None)
        return EpisodeConfig(
            env=self.spec.env,
            prompt_builder=self.spec.prompt_builder,
            action_parser=self.spec.action_parser,
            max_steps=self.spec.max_steps,
            sampling=sampling,
            max_episode_tokens=int(budget),
            stop_token_ids=tuple(dict.fromkeys(eos + stop_ids)),
            max_model_len=int(max_len) if max_len else None,
        )

    async def _rollout(self, prompts: list[Any], view: trl_compat.TrainerView) -> dict[str, list[Any]]:
        started = time.perf_counter()
        self.calls += 1
        template, generator = self._setup(view)
        if getattr(generator, "failure", None) is not None:
            generator.reset_failure()  # the server failed in an earlier call; it may be back
        cfg = self._episode_config(view, generator)
        groups = group_indices(prompts, view.num_generations)
        specs = self._episode_specs(prompts, groups, view)
        rollout_ids = [evalprotocol.new_id("rollout") for _ in specs]
        context = RowContext(self.spec, self.invocation_id, self.backend_name, view)
        if self._log is not None:
            for spec, rid in zip(specs, rollout_ids):
                context.log_row(self._log, spec, rid, prompts[spec.index], spec.initial_messages, ())

        limit = asyncio.Semaphore(max(1, self.spec.max_concurrent_rollouts))

        def step_logger(spec: EpisodeSpec, rollout_id: str) -> StepCallback | None:
            log = self._log
            if log is None:
                return None
            return lambda messages, rewards: context.log_row(log, spec, rollout_id, prompts[spec.index], messages,
                                                             rewards)

        envs = EnvPool(cfg.env, reuse=self.reuse_env_sessions)

        async def bounded(spec: EpisodeSpec, rollout_id: str) -> Episode:
            async with limit:
                return await run_episode(spec, cfg, template, generator, envs, step_logger(spec, rollout_id))

        try:
            episodes = list(await asyncio.gather(*(bounded(s, r) for s, r in zip(specs, rollout_ids))))
        finally:
            await envs.aclose()
        failure = getattr(generator, "failure", None)
        if failure is not None:  # the backend failed for good (e.g. the vLLM server is gone): stop, do not train on it
            raise failure
        rows = [context.episode_row(ep, rid, prompts[ep.spec.index]) for ep, rid in zip(episodes, rollout_ids)]
        scored = await score_rows(self.spec, rows, [ep.status == "finished" for ep in episodes], groups)
        if self._log is not None:
            context.log_final(self._log, episodes, scored, time.perf_counter() - started)
        self._report(episodes, scored, view, time.perf_counter() - started, envs.opened)
        return _trl_output(episodes, scored, rollout_ids)

    def _episode_specs(self, prompts: list[Any], groups: list[list[int]],
                       view: trl_compat.TrainerView) -> list[EpisodeSpec]:
        """One spec per prompt, in prompt order; tasks rotate per prompt group, counted across calls and, under
        ``accelerate launch``, across processes (each process gets its own slice of the step's groups)."""
        first_group = self._groups_started * view.num_processes + view.process_index * len(groups)
        self._groups_started += len(groups)
        system_prompt = self.spec.completion_params.get("system_prompt")
        specs: list[EpisodeSpec] = []
        for g, members in enumerate(groups):
            task = self._task_for(first_group + g)
            for k, i in enumerate(members):
                messages = initial_messages(prompts[i])
                if system_prompt and not any(m.get("role") == "system" for m in messages):
                    messages = ({"role": "system", "content": system_prompt},) + messages
                specs.append(EpisodeSpec(index=i, group=first_group + g, generation=k, task=task,
                                         initial_messages=messages))
        return sorted(specs, key=lambda s: s.index)

    def _task_for(self, group_number: int) -> str | None:
        tasks = self.spec.env.tasks
        return tasks[group_number % len(tasks)] if tasks else None

    def _report(self, episodes: list[Episode], scored: list[Scored], view: trl_compat.TrainerView, seconds: float,
                env_sessions: int) -> None:
        n = len(episodes)
        failed = sum(ep.status != "finished" for ep in episodes)
        scores = [s.score for s in scored if s.score is not None]
        metrics = {
            "ep_trl/episodes_per_s": n / seconds if seconds > 0 else math.inf,
            "ep_trl/failed_fraction": failed / n,
            "ep_trl/unscored_fraction": (n - len(scores)) / n,
            "ep_trl/mean_turns": sum(ep.num_turns for ep in episodes) / n,
            "ep_trl/template_realigned": float(sum(ep.trajectory.realigned for ep in episodes)),
            "ep_trl/env_sessions_opened": float(env_sessions),
        }
        view.record_metrics(metrics)
        logger.info(
            "ep_trl step %d: %d episodes in %.1f s (%.2f/s), mean score %s, %d failed, %d unscored, %.1f turns/episode",
            view.global_step, n, seconds, metrics["ep_trl/episodes_per_s"],
            f"{sum(scores) / len(scores):.3f}" if scores else "n/a", failed, n - len(scores),
            metrics["ep_trl/mean_turns"])


def _trl_output(episodes: list[Episode], scored: list[Scored], rollout_ids: list[str]) -> dict[str, list[Any]]:
    trajectories = [ep.trajectory for ep in episodes]
    return {
        "prompt_ids": [list(t.prompt_ids) for t in trajectories],
        "completion_ids": [list(t.completion_ids) for t in trajectories],
        "logprobs": [list(t.logprobs) for t in trajectories],
        "env_mask": [list(t.env_mask) for t in trajectories],
        "eval_score": [s.score for s in scored],
        "step_rewards": [list(ep.step_rewards) for ep in episodes],
        "num_turns": [ep.num_turns for ep in episodes],
        "episode_status": [ep.status for ep in episodes],
        "template_realigned": [t.realigned for t in trajectories],
        "rollout_id": rollout_ids,
    }


def create_openenv_vllm_rollout_func(
    env_path: str,
    *,
    backend: Backend = "auto",
    vllm_base_url: str | None = None,
    max_episode_tokens: int | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    vllm_max_in_flight: int = 64,
    vllm_request_timeout_s: float = 120.0,
    vllm_max_retries: int = 3,
    vllm_retry_backoff_s: float = 0.5,
    vllm_connect_timeout_s: float = 10.0,
    vllm_batch_window_s: float = 0.005,
    env_factory: Callable[[], Any] | None = None,
    env_client_cls: type | None = None,
    env_base_url: str | None = None,
    request_timeout_s: float | None = None,
    prompt_builder: Callable[[Any, int, list[str]], Any] | None = None,
    action_parser: Callable[[str], Any] | None = None,
    tasks: Sequence[str] | None = None,
    task_var: str | None = None,
    reset_task_kwarg: str | None = None,
    max_steps: int | None = None,
    max_tokens: int | None = None,
    stop: Sequence[str] | None = None,
    max_concurrent_rollouts: int | None = None,
    evaluation_test_kwargs: Mapping[str, Any] | None = None,
    log_rollouts: bool = True,
    log_home: str | os.PathLike | None = None,
    reuse_env_sessions: bool = True,
) -> RolloutFunction:
    """Build a TRL ``rollout_func`` that plays the eval's environment and scores episodes with the eval's body.

    Args:
        env_path: ``"pkg.module::test_name"``, ``"pkg.module"`` (its only eval test) or ``"path/to/eval.py::test_name"``.
        backend: ``"trainer"`` samples in-process with ``trainer.model``; ``"vllm"`` uses a vLLM server (the trainer's
            when ``GRPOConfig(use_vllm=True, vllm_mode="server")``, else ``vllm_base_url``); ``"auto"`` picks vllm when
            either is available, trainer otherwise.
        vllm_base_url: a vLLM server to generate with when the trainer has none of its own. Nothing pushes the
            trainer's weights there, so rollouts are off-policy after the first optimizer step (docs/vllm.md).
        max_episode_tokens: completion tokens per episode (sampled and inserted); defaults to the GRPOConfig's
            ``max_completion_length``. TRL does not truncate rollout output, so the episode stops when it is spent.
        chat_template_kwargs: passed to ``apply_chat_template`` (e.g. ``{"enable_thinking": False}``).
        vllm_max_in_flight: vLLM backend: most episode turns in flight at once (concurrent episodes' turns overlap
            up to this; the server batches them).
        vllm_request_timeout_s: vLLM backend: total time one request may take before it counts as failed.
        vllm_max_retries, vllm_retry_backoff_s: vLLM backend: a timed-out, dropped, 5xx or 429 request is retried
            this many times, waiting ``backoff * 2**k`` seconds; then the rollout call raises ``GenerationError``
            naming the request. Other 4xx (e.g. a prompt over ``max_model_len``) raise at once.
        vllm_connect_timeout_s: vLLM backend: how long the first contact (``GET /v1/models``) and each
            connection may take; an unreachable server fails within it, naming the URL.
        vllm_batch_window_s: vLLM backend: turns with the same sampling settings that arrive within this many
            seconds of each other go out as one request with a list of prompts (0 = one request per turn).
        log_rollouts: write every training rollout to eval-protocol's dataset logger, the store ``ep logs`` shows
            (running, after each step, then scored). eval-protocol's ``DISABLE_EP_SQLITE_LOG=1`` also turns it off.
        reuse_env_sessions: an episode that ended cleanly hands its environment session to the next episode of the
            same call, which starts with ``reset()`` (as TRL's own environments are constructed once and reset often);
            failed episodes' sessions are closed, and all are closed when the call ends. False opens one session per
            episode, as eval-protocol's processor does: for environments whose constructor does per-episode work.
        log_home: send those rows to ``<log_home>/.eval_protocol/logs.db`` instead of ``~/.eval_protocol/logs.db``
            (view them with ``HOME=<log_home> ep logs``).
        The remaining keyword arguments replace the eval's own settings of the same name.

    Returns:
        A callable ``rollout_func(prompts, trainer)`` whose output holds ``prompt_ids``, ``completion_ids``,
        ``logprobs``, ``env_mask``, ``eval_score``, ``step_rewards``, ``num_turns``, ``episode_status``,
        ``template_realigned`` and ``rollout_id`` (the row's id in ``ep logs``), one entry per prompt, in order.
    """
    if backend not in ("auto", "trainer", "vllm"):
        raise ConfigError(f"backend must be 'auto', 'trainer' or 'vllm', not {backend!r}.")
    trl_version = trl_compat.check_version()
    evalprotocol.check_version()
    spec = Overrides(
        env_factory=env_factory, env_client_cls=env_client_cls, env_base_url=env_base_url,
        request_timeout_s=request_timeout_s, prompt_builder=prompt_builder, action_parser=action_parser,
        tasks=tasks, task_var=task_var, reset_task_kwarg=reset_task_kwarg, max_steps=max_steps,
        max_tokens=max_tokens, stop=stop, max_concurrent_rollouts=max_concurrent_rollouts,
        evaluation_test_kwargs=evaluation_test_kwargs,
    ).apply(evalprotocol.read_eval_spec(resolve_eval_test(env_path)))
    spec.env.check()
    for note in spec.notes:
        logger.info(note)
    if spec.max_steps < 1:
        raise ConfigError(f"max_steps must be >= 1, got {spec.max_steps}.")
    if max_episode_tokens is not None and max_episode_tokens < 1:
        raise ConfigError(f"max_episode_tokens must be >= 1, got {max_episode_tokens}.")
    trainer_signature = trl_compat.passes_trainer(trl_version)
    if not trainer_signature and backend == "trainer":
        raise ConfigError(f"TRL {trl_version} passes no trainer to rollout_func; use backend='vllm' with vllm_base_url.")
    logger.info("ep_trl: training on %s (%s, mode %s, %d max steps, tasks %s)", spec.qualified_name,
                spec.env.describe(), spec.mode, spec.max_steps, list(spec.env.tasks) or "none")
    if vllm_base_url and backend != "trainer":
        probe_server(vllm_base_url, vllm_connect_timeout_s)  # an unreachable server fails now, not mid-training
    writer = RolloutLogWriter(make_dataset_logger(log_home)) if log_rollouts else None
    return RolloutFunction(spec, backend, vllm_base_url, max_episode_tokens, chat_template_kwargs, trainer_signature,
                           {"max_in_flight": vllm_max_in_flight, "request_timeout_s": vllm_request_timeout_s,
                            "max_retries": vllm_max_retries, "retry_backoff_s": vllm_retry_backoff_s,
                            "connect_timeout_s": vllm_connect_timeout_s, "batch_window_s": vllm_batch_window_s},
                           writer, reuse_env_sessions)
