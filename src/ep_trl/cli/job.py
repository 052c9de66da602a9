"""A planned ``ep-trl train`` run (:class:`~ep_trl.cli.arguments.TrainJob`) carried out: the environment server,
the held-out play, the warm start, the vLLM server the run starts itself, the trainer and its ``train()``, and the run
folder (resolved config, metrics, checkpoint, plot, ``result.json``), written however the run ends."""

import contextlib
import time
from collections.abc import Iterator
from dataclasses import fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import ConfigError
from . import modes, run_folder
from .arguments import TRAIN_DEFAULTS, RunArguments, TrainJob
from .checks import template_problem, warm_start_settings
from .ranks import Ranks, from_main, receive, send, send_failure
from .rows import held_out_seed, refuse_held_out, refuse_held_out_variants, split_rows
from .run_result import RunState, finish, resolved_config

if TYPE_CHECKING:
    from peft import LoraConfig
    from transformers import Trainer

    from .heldout import HeldOutPlay
    from .heldout_figures import HeldOutEpisodes
    from .warm_start import WarmStartReport


def run(job: TrainJob) -> int:
    """Train ``job``, writing its run folder; 0 when training ended. Ctrl-C and SIGTERM stop it with what was written
    kept (``result.json`` says how the run ended), the environment server stopped, and the interruption raised on."""
    from transformers import PrinterCallback

    from ..devtools import run_record
    from ..runtime import shutdown
    from .progress import ProgressPrinter, script_logging
    from .time_budget import TimeBudget

    script_logging()
    shutdown.handle_sigterm()
    ranks = Ranks.from_env()
    started = time.monotonic()
    # a preset names the checkout of its script; `ep-trl train`, the directory it runs in
    where = Path(job.command[1]).resolve().parent if job.preset.command else Path.cwd()
    record = run_record.start_anywhere(where, job.command[1:], executable=job.command[0])
    folder = Path(job.config_values["output_dir"])
    made = ranks.main and not folder.exists()
    if ranks.main:  # the main process alone writes the run folder and prints
        folder.mkdir(parents=True, exist_ok=True)
        (folder / run_folder.METRICS).unlink(missing_ok=True)
        print(job.mode.describe() + _processes(ranks), flush=True)
    state = RunState()
    try:
        # closed last in, first out: the vLLM server the run started, the held-out play, the environment server
        with _environment(job, ranks) as env_urls, contextlib.ExitStack() as servers:
            env_url = env_urls[0] if env_urls else None
            job = spread_over(job, env_urls)  # training's sessions and the held-out set's
            held_out = servers.enter_context(_held_out_play(job, ranks))
            if not from_main(ranks, lambda: _held_out_accepted(job, held_out, folder if made else None)):
                return 2
            began = time.monotonic()
            preset_model = job.preset.start_model
            model = from_main(ranks, lambda: preset_model(env_url, job.model)) if preset_model else job.model
            state.start_model_s = time.monotonic() - began if preset_model else None
            assert model is not None, "plan() refuses a run without --model when the preset starts no model"
            if job.model is None and (job.chat_template is not None or job.tools_offered is not None):
                problem = template_problem(model, job.chat_template, job.tools_offered, job.env_path)
                if problem:  # the preset's own model: plan() could not check its tokenizer
                    raise ConfigError(problem)
            policy: str = model
            state.warm_start = from_main(ranks, lambda: _warm_start(job, policy, folder))
            model = state.warm_start.model_dir if state.warm_start is not None else model
            train_rows = split_rows(job)[0]
            job = servers.enter_context(_local_vllm_server(job, model, folder, ranks))
            if held_out is not None:
                count = held_out.variants.instances if held_out.variants is not None else len(held_out.prompts)
                what = (
                    f"{count} held-out rows"
                    if not job.openenv
                    else f"{count} held-out reset seeds"
                    if held_out.split is not None
                    else f"{count} held-out episodes of the held-out tasks {list(held_out.tasks)}"
                )
                if held_out.variants is not None:
                    v = held_out.variants
                    what += (
                        f", each under {len(v.values)} values of {v.name} ({', '.join(v.values)}): "
                        f"{len(held_out.prompts)} held-out episodes"
                    )
                print(f"model {model}; eval {job.env_path}: {len(train_rows)} training rows, {what}", flush=True)
                state.held_out = held_out
            # the training episodes leave out the held-out instances on every process (the main process knows them)
            overrides = from_main(
                ranks, lambda: held_out.training_overrides(job.overrides) if held_out is not None else job.overrides
            )
            config = job.mode.config(**config_values(job))
            if ranks.main:
                run_folder.write_config(folder, resolved_config(job, model, config))
            budget = (
                TimeBudget(job.run.time_budget_s, state.warm_start.seconds if state.warm_start else 0.0)
                if job.run.time_budget_s is not None
                else None
            )
            state.budget = budget
            # the metrics line is written before the progress line is printed: a step a reader saw is on disk
            with job.mode.trainer(
                job.env_path,
                model=model,
                args=config,
                train_dataset=train_rows,
                callbacks=[
                    *([run_folder.MetricsLog(folder / run_folder.METRICS), ProgressPrinter()] if ranks.main else []),
                    *([budget] if budget is not None else []),
                ],
                peft_config=lora_config(job.run),
                images=job.mode.images,
                overrides=overrides,
                options=job.options,
                vllm=job.vllm,
                chat_template=job.chat_template,
                max_concurrent_rollouts=job.max_concurrent_rollouts,
                provider=job.run.env_provider,
            ) as trainer:
                state.trainer = trainer
                trainer.remove_callback(PrinterCallback)  # ProgressPrinter prints one line per step instead
                if ranks.main:
                    _print_lora(trainer, job.run)
                state.before = _play_held_out(held_out, trainer, "before training")
                training = time.monotonic()  # train_s: the trainer's construction to train()'s return
                trainer.train()
                # the warm start is part of training: its seconds count in the training time
                state.train_s = time.monotonic() - training + (state.warm_start.seconds if state.warm_start else 0.0)
                state.checkpoint = _save_checkpoint(trainer, folder)
                state.after = _play_held_out(held_out, trainer, "after training")
            if job.preset.after_training is not None and ranks.main:
                job.preset.after_training(trainer)
    except (KeyboardInterrupt, shutdown.Terminated) as stop:
        how = "interrupted" if isinstance(stop, KeyboardInterrupt) else "terminated"
        state.ended = f"{how} (Ctrl-C)" if how == "interrupted" else f"{how} (SIGTERM)"
        if ranks.main:
            finish(job, folder, state, record, started, ranks)
            print(f"{how}: environment server stopped; the run folder keeps what was written: {folder}", flush=True)
        raise
    if ranks.main:
        finish(job, folder, state, record, started, ranks)
    return 0


def _processes(ranks: Ranks) -> str:
    """The progress line's note of a multi-process run (nothing for one process)."""
    return f"; {ranks.world_size} processes, each training on its own share of the prompts" if ranks.several else ""


def _held_out_accepted(job: TrainJob, held_out: "HeldOutPlay | None", made_folder: Path | None) -> bool:
    """Whether the environment takes the held-out instances (their seeds, their reset values); when it does not, the
    refusal is printed (exit status 2, as for bad input) and the run folder this run made is removed."""
    if held_out is not None and held_out.split is not None:
        problem = held_out.seed_problem()
        if problem is not None:
            refuse_held_out(job, problem, made_folder)
            return False
    if held_out is not None and held_out.variants is not None:
        problem = held_out.variant_problem()
        if problem is not None:
            refuse_held_out_variants(job, problem, made_folder)
            return False
    return True


def spread_over(job: TrainJob, env_urls: tuple[str, ...]) -> TrainJob:
    """``job`` with each session going to the one of ``env_urls`` (the run's replicas) with the fewest open; as given
    for one URL or none."""
    if len(env_urls) < 2:
        return job
    return replace(job, overrides=replace(job.overrides, env_replicas=env_urls, env_url_var=job.run.env_url_var))


@contextlib.contextmanager
def _environment(job: TrainJob, ranks: Ranks) -> Iterator[tuple[str, ...]]:
    """The run's ``--env-server`` (``--env-replicas`` copies of it), the first one's URL exported in
    ``--env-url-var``; the URLs, () without one; stopped when the block ends, however. The main process starts them;
    the other processes export the URL."""
    from ..runtime.processes import exported

    if job.run.env_server is None:
        yield ()
        return
    if not ranks.main:
        urls = tuple(str(url) for url in receive(ranks))  # type: ignore[attr-defined]  # the main process's tuple
        with exported(job.run.env_url_var, urls[0]):
            yield urls
        return
    sent = False
    try:
        with _started_servers(job) as urls, exported(job.run.env_url_var, urls[0]):
            send(ranks, urls)
            sent = True
            yield urls
    except BaseException as error:
        if not sent:  # the other processes wait for the URLs
            send_failure(ranks, error)
        raise


@contextlib.contextmanager
def _started_servers(job: TrainJob) -> Iterator[tuple[str, ...]]:
    """``--env-server``, or its ``--env-replicas`` copies, running for the block; their URLs."""
    from .env_server import command_server
    from .replicas import Replicas

    assert job.run.env_server is not None
    health, timeout_s = job.run.env_server_health, job.run.env_server_timeout_s
    if job.run.env_replicas == 1:
        with command_server(
            job.run.env_server, env=job.preset.env_server_env, health_path=health, timeout_s=timeout_s
        ) as url:
            print(f"environment server: {url} (${job.run.env_url_var})", flush=True)
            yield (url,)
        return
    replicas = Replicas(
        job.run.env_server, job.run.env_replicas, env=job.preset.env_server_env, health_path=health, timeout_s=timeout_s
    )
    try:
        for index, (url, pid) in enumerate(zip(replicas.urls, replicas.pids)):
            print(f"environment replica {index}: {url} (pid {pid})", flush=True)
        yield replicas.urls
    finally:
        replicas.close()


@contextlib.contextmanager
def _local_vllm_server(job: TrainJob, model: str, folder: Path, ranks: Ranks) -> Iterator[TrainJob]:
    """``--vllm-server-url local``: a CPU vLLM server on ``model`` for the block (its log in the run folder), and the
    job generating on it; stopped, its process group with it, when the block ends, however. Other jobs: as they
    are. The main process starts it; the others generate on it."""
    if job.local_max_model_len is None:
        yield job
        return

    if not ranks.main:
        sent = receive(ranks)
        assert isinstance(sent, tuple), "the main process sends its server's URL and served model"
        url, served = sent
        yield replace(job, mode=replace(job.mode, vllm_base_url=url), served_model=served)
        return

    from ..devtools.cpu_vllm import start_vllm_server, stop_vllm_server
    from ..generation.probe import probe_server

    print(
        f"vLLM server: starting vLLM's CPU build on {model} (--max-model-len {job.local_max_model_len}; its log "
        f"in {folder})",
        flush=True,
    )
    started = time.monotonic()
    try:
        server = start_vllm_server(
            model, folder, max_model_len=job.local_max_model_len, extra_args=job.local_server_args
        )
    except BaseException as error:
        send_failure(ranks, error)
        raise
    try:
        try:
            served = probe_server(server.base_url, job.vllm.connect_timeout_s).model
        except BaseException as error:
            send_failure(ranks, error)
            raise
        send(ranks, (server.base_url, served))
        print(
            f"vLLM server: {server.base_url} (pid {server.pid}), ready in {time.monotonic() - started:.0f} s",
            flush=True,
        )
        yield replace(job, mode=replace(job.mode, vllm_base_url=server.base_url), served_model=served)
    finally:
        stop_vllm_server(server)
        print(f"vLLM server: stopped (pid {server.pid})", flush=True)


@contextlib.contextmanager
def _held_out_play(job: TrainJob, ranks: Ranks) -> "Iterator[HeldOutPlay | None]":
    """The run's held-out instances and the rollout function that plays them (None without ``--held-out``, and on
    every process but the main one); closed when the block ends, however. Built once the environment server is up (an
    OpenEnv eval's seed check resets it)."""
    if not job.run.held_out or not ranks.main:
        yield None
        return
    from .. import dataset_from_eval
    from .heldout import HeldOutPlay

    prompts = (
        list(dataset_from_eval(job.env_path, input_dataset=job.overrides.input_dataset)["prompt"])
        if job.openenv
        else split_rows(job)[1]
    )
    play = HeldOutPlay(
        job.env_path,
        prompts,
        openenv=job.openenv,
        count=int(job.run.held_out) if job.openenv else len(prompts),
        seed=held_out_seed(job),
        overrides=job.overrides,
        options=job.options,
        vllm=job.vllm,
        max_concurrent_rollouts=job.max_concurrent_rollouts,
        tasks=(tuple(job.run.held_out_tasks or ()), job.training_tasks),
        variants=job.held_out_variants,
        provider=job.run.env_provider,
    )
    try:
        yield play
    finally:
        play.close()


def _warm_start(job: TrainJob, model: str, folder: Path) -> "WarmStartReport | None":
    """``--warm-start``: ``model`` fine-tuned on the demonstrations, saved in the run folder and, when the run
    generates on a vLLM server, loaded into it; what it did, with where GRPO starts from (None without a warm
    start)."""
    if job.demonstrations is None:
        return None
    from ..capture.parsing import use_chat_template
    from .warm_start import WARM_START_DIR, load_processing_class, warm_start

    print(
        f"warm start: {len(job.demonstrations.lines)} demonstrations from {job.demonstrations.path}, "
        f"{job.run.warm_start_epochs} epoch(s)",
        flush=True,
    )
    processing_class = load_processing_class(model)
    if job.chat_template is not None:  # the run renders with --chat-template: so do the demonstrations
        use_chat_template(processing_class, job.chat_template)
    report = warm_start(
        model,
        job.demonstrations,
        folder / WARM_START_DIR,
        warm_start_settings(job.run, job.config_values),
        processing_class=processing_class,
        chat_template_kwargs=job.options.chat_template_kwargs,
        # a server the run starts itself (local) is started after, on the warm-started model
        server_url=None if job.mode.vllm_base_url == modes.LOCAL_SERVER else job.mode.vllm_base_url,
    )
    print(
        f"warm start: {report.tokens_trained} assistant tokens trained in {report.seconds:.1f} s, loss "
        f"{report.loss_first_epoch:.4f} (first epoch) -> {report.loss_last_epoch:.4f} (last); GRPO starts from "
        f"{report.model_dir}",
        flush=True,
    )
    return report


def _play_held_out(held_out: "HeldOutPlay | None", trainer: "Trainer", when: str) -> "HeldOutEpisodes | None":
    if held_out is None:
        return None
    from .heldout_figures import per_value_summary

    played = held_out.play(trainer)
    print(played.summary(when), flush=True)
    if held_out.variants is not None:
        print(per_value_summary(held_out.variants, played, when), flush=True)
    return played


def config_values(job: TrainJob) -> dict[str, object]:
    """The trainer config's values: all of them for ``GRPOConfig``; for ``AsyncGRPOConfig`` those set away from
    ``GRPOConfig``'s defaults that it has (its own defaults apply to the rest)."""
    if not job.mode.asynchronous:
        return dict(job.config_values)
    from trl import GRPOConfig
    from trl.experimental.async_grpo import AsyncGRPOConfig

    defaults = {f.name: f.default for f in fields(GRPOConfig) if f.init}
    accepted = {f.name for f in fields(AsyncGRPOConfig) if f.init}
    return {
        k: v
        for k, v in job.config_values.items()
        if k in accepted and (k in TRAIN_DEFAULTS or k == "output_dir" or v != defaults.get(k))
    }


def lora_config(run_args: RunArguments) -> "LoraConfig | None":
    if run_args.lora_r <= 0:
        return None
    from peft import LoraConfig

    targets = run_args.lora_target_modules
    return LoraConfig(
        r=run_args.lora_r,
        lora_alpha=run_args.lora_alpha or 2 * run_args.lora_r,
        lora_dropout=run_args.lora_dropout,
        task_type="CAUSAL_LM",
        target_modules=targets if targets == "all-linear" else [t.strip() for t in targets.split(",") if t.strip()],
    )


def _print_lora(trainer: Any, run_args: RunArguments) -> None:
    if run_args.lora_r <= 0:
        return
    trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in trainer.model.parameters())
    print(
        f"LoRA r={run_args.lora_r} alpha={run_args.lora_alpha or 2 * run_args.lora_r}: {trainable} of {total} "
        "parameters trainable",
        flush=True,
    )


def _save_checkpoint(trainer: "Trainer", folder: Path) -> Path:
    path = folder / run_folder.CHECKPOINT
    trainer.save_model(str(path))
    return path
