"""A planned ``ep-trl train`` run (:class:`~ep_trl.cli.arguments.TrainJob`) carried out: the environment server,
the held-out play, the warm start, the vLLM server the run starts itself, the trainer and its ``train()``, and the run
folder (resolved config, metrics, checkpoint, plot, ``result.json``), written however the run ends."""

import contextlib
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import ConfigError
from . import modes, run_folder
from .arguments import PROG, TRAIN_DEFAULTS, RunArguments, TrainJob
from .checks import template_problem, warm_start_settings
from .rows import held_out_seed, refuse_held_out, refuse_held_out_variants, split_rows

if TYPE_CHECKING:
    from peft import LoraConfig
    from transformers import Trainer
    from trl import GRPOConfig
    from trl.experimental.async_grpo import AsyncGRPOConfig

    from ..devtools.run_record import RunStart
    from .heldout import HeldOutPlay
    from .heldout_figures import HeldOutEpisodes
    from .time_budget import TimeBudget
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
    started = time.monotonic()
    # a preset names the checkout of its script; `ep-trl train`, the directory it runs in
    where = Path(job.command[1]).resolve().parent if job.preset.command else Path.cwd()
    record = run_record.start_anywhere(where, job.command[1:], executable=job.command[0])
    folder = Path(job.config_values["output_dir"])
    made = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / run_folder.METRICS).unlink(missing_ok=True)
    print(job.mode.describe(), flush=True)
    state = _RunState()
    try:
        # closed last in, first out: the vLLM server the run started, the held-out play, the environment server
        with _environment(job) as env_url, _held_out_play(job) as held_out, contextlib.ExitStack() as servers:
            if held_out is not None and held_out.split is not None:
                problem = held_out.seed_problem()
                if problem is not None:
                    refuse_held_out(job, problem, folder if made else None)
                    return 2
            if held_out is not None and held_out.variants is not None:
                problem = held_out.variant_problem()
                if problem is not None:
                    refuse_held_out_variants(job, problem, folder if made else None)
                    return 2
            began = time.monotonic()
            model = job.preset.start_model(env_url, job.model) if job.preset.start_model else job.model
            state.start_model_s = time.monotonic() - began if job.preset.start_model else None
            assert model is not None, "plan() refuses a run without --model when the preset starts no model"
            if job.model is None and (job.chat_template is not None or job.tools_offered is not None):
                problem = template_problem(model, job.chat_template, job.tools_offered, job.env_path)
                if problem:  # the preset's own model: plan() could not check its tokenizer
                    raise ConfigError(problem)
            model, state.warm_start = _warm_start(job, model, folder)
            train_rows = split_rows(job)[0]
            job = servers.enter_context(_local_vllm_server(job, model, folder))
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
            overrides = held_out.training_overrides(job.overrides) if held_out is not None else job.overrides
            config = job.mode.config(**config_values(job))
            run_folder.write_config(folder, _resolved(job, model, config))
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
                    run_folder.MetricsLog(folder / run_folder.METRICS),
                    ProgressPrinter(),
                    *([budget] if budget is not None else []),
                ],
                peft_config=lora_config(job.run),
                images=job.mode.images,
                overrides=overrides,
                options=job.options,
                vllm=job.vllm,
                chat_template=job.chat_template,
                max_concurrent_rollouts=job.max_concurrent_rollouts,
            ) as trainer:
                state.trainer = trainer
                trainer.remove_callback(PrinterCallback)  # ProgressPrinter prints one line per step instead
                _print_lora(trainer, job.run)
                state.before = _play_held_out(held_out, trainer, "before training")
                training = time.monotonic()  # train_s: the trainer's construction to train()'s return
                trainer.train()
                # the warm start is part of training: its seconds count in the training time
                state.train_s = time.monotonic() - training + (state.warm_start.seconds if state.warm_start else 0.0)
                state.checkpoint = _save_checkpoint(trainer, folder)
                state.after = _play_held_out(held_out, trainer, "after training")
            if job.preset.after_training is not None:
                job.preset.after_training(trainer)
    except KeyboardInterrupt:
        state.ended = "interrupted (Ctrl-C)"
        _finish(job, folder, state, record, started)
        print(f"interrupted: environment server stopped; the run folder keeps what was written: {folder}", flush=True)
        raise
    except shutdown.Terminated:
        state.ended = "terminated (SIGTERM)"
        _finish(job, folder, state, record, started)
        print(f"terminated: environment server stopped; the run folder keeps what was written: {folder}", flush=True)
        raise
    _finish(job, folder, state, record, started)
    return 0


@dataclass
class _RunState:
    trainer: "Trainer | None" = None
    held_out: "HeldOutPlay | None" = None
    before: "HeldOutEpisodes | None" = None
    after: "HeldOutEpisodes | None" = None
    checkpoint: Path | None = None
    ended: str = "finished"
    train_s: float | None = None
    budget: "TimeBudget | None" = None
    warm_start: "WarmStartReport | None" = None
    #: The seconds the preset's ``start_model`` took (None without one).
    start_model_s: float | None = None


@contextlib.contextmanager
def _environment(job: TrainJob) -> Iterator[str | None]:
    """The run's ``--env-server``, its URL exported in ``--env-url-var``; stopped when the block ends, however."""
    from .env_server import command_server

    if job.run.env_server is None:
        yield None
        return
    with command_server(
        job.run.env_server,
        url_var=job.run.env_url_var,
        env=job.preset.env_server_env,
        health_path=job.run.env_server_health,
        timeout_s=job.run.env_server_timeout_s,
    ) as url:
        print(f"environment server: {url} (${job.run.env_url_var})", flush=True)
        yield url


@contextlib.contextmanager
def _local_vllm_server(job: TrainJob, model: str, folder: Path) -> Iterator[TrainJob]:
    """``--vllm-server-url local``: a CPU vLLM server on ``model`` for the block (its log in the run folder), and the
    job generating on it; stopped, its process group with it, when the block ends, however. Other jobs: as they
    are."""
    if job.local_max_model_len is None:
        yield job
        return
    from dataclasses import replace

    from ..devtools.cpu_vllm import start_vllm_server, stop_vllm_server
    from ..generation.probe import probe_server

    print(
        f"vLLM server: starting vLLM's CPU build on {model} (--max-model-len {job.local_max_model_len}; its log "
        f"in {folder})",
        flush=True,
    )
    started = time.monotonic()
    server = start_vllm_server(model, folder, max_model_len=job.local_max_model_len, extra_args=job.local_server_args)
    try:
        served = probe_server(server.base_url, job.vllm.connect_timeout_s).model
        print(
            f"vLLM server: {server.base_url} (pid {server.pid}), ready in {time.monotonic() - started:.0f} s",
            flush=True,
        )
        yield replace(job, mode=replace(job.mode, vllm_base_url=server.base_url), served_model=served)
    finally:
        stop_vllm_server(server)
        print(f"vLLM server: stopped (pid {server.pid})", flush=True)


@contextlib.contextmanager
def _held_out_play(job: TrainJob) -> "Iterator[HeldOutPlay | None]":
    """The run's held-out instances and the rollout function that plays them (None without ``--held-out``); closed
    when the block ends, however. Built once the environment server is up (an OpenEnv eval's seed check resets it)."""
    if not job.run.held_out:
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
    )
    try:
        yield play
    finally:
        play.close()


def _warm_start(job: TrainJob, model: str, folder: Path) -> "tuple[str, WarmStartReport | None]":
    """``--warm-start``: ``model`` fine-tuned on the demonstrations, saved in the run folder and, when the run
    generates on a vLLM server, loaded into it; the model GRPO starts from (``model`` itself without a warm start)."""
    if job.demonstrations is None:
        return model, None
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
    return report.model_dir, report


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


def _resolved(job: TrainJob, model: str, config: "GRPOConfig | AsyncGRPOConfig") -> dict[str, object]:
    """``config.yaml``'s content: ENV_PATH, the model, the mode, ep_trl's options and the trainer config."""
    return {
        "env_path": job.env_path,
        "model": model,
        "generation": job.mode.describe(),
        **{k: v for group in (job.run,) for k, v in asdict(group).items() if k != "model"},
        "chat_template_file": str(job.chat_template.path) if job.chat_template is not None else None,
        "eval_overrides": {k: v for k, v in asdict(job.overrides).items() if v is not None},
        "rollout_options": asdict(job.options),
        "vllm_options": asdict(job.vllm),
        "max_concurrent_rollouts": job.max_concurrent_rollouts,
        "trainer_config": {"class": type(config).__name__, **config.to_dict()},
    }


def _finish(job: TrainJob, folder: Path, state: _RunState, record: "RunStart", started: float) -> None:
    """The closing summary, the plot and ``result.json``, from what was logged (none of them when no step was)."""
    from ..devtools import run_record
    from .heldout_figures import held_out_change, per_value_change
    from .progress import report_training
    from .reward_curve import step_scores

    history = list(state.trainer.state.log_history) if state.trainer is not None else []
    steps = step_scores(history)
    values = job.config_values
    per_step = int(values.get("per_device_train_batch_size") or 8) * int(values.get("gradient_accumulation_steps") or 1)
    summary = plot = None
    if steps:
        marks = [(0, state.before.success, "held-out before")] if state.before is not None else []
        if state.after is not None:
            marks.append((steps[-1].step, state.after.success, "held-out after"))
        title = job.preset.title or f"{PROG}: eval score on {job.env_path.rsplit('::', 1)[-1]}"
        summary = report_training(
            history,
            folder / run_folder.PLOT,
            episodes_per_step=per_step,
            started=started,
            title=title,
            marks=marks,
            command=record.command,
        )
        plot = folder / run_folder.PLOT
    else:
        print(f"no step logged a score ({state.ended}): no summary, no plot", flush=True)
    variants = job.held_out_variants
    if state.before is not None and state.after is not None:
        print(held_out_change(state.before, state.after), flush=True)
        if variants is not None:
            print(per_value_change(variants, state.before, state.after), flush=True)
    result = {
        "run": run_record.finish(record),
        "ended": state.ended,
        "versions": run_folder.versions(),
        "env_path": job.env_path,
        "seed": values.get("seed"),
        "steps": len(steps),
        "train_first": summary.first if summary else None,
        "train_last": summary.last if summary else None,
        "wall_s": round(time.monotonic() - started, 1),
        "train_s": round(state.train_s, 1) if state.train_s is not None else None,
        **run_folder.held_out_instances(state.held_out),
        "held_out_before": state.before.success if state.before is not None else None,
        "held_out_after": state.after.success if state.after is not None else None,
        "held_out_before_figures": state.before.figures() if state.before is not None else None,
        "held_out_after_figures": state.after.figures() if state.after is not None else None,
        "held_out_reset_kwarg": (
            {"name": variants.name, "values": list(variants.values)} if variants is not None else None
        ),
        **{
            f"held_out_{when}_per_value": (
                played.per_value(variants.name, variants.values)
                if played is not None and variants is not None
                else None
            )
            for when, played in (("before", state.before), ("after", state.after))
        },
        "plot": str(plot) if plot else None,
        "checkpoint": str(state.checkpoint) if state.checkpoint else None,
        "metrics": str(folder / run_folder.METRICS),
        "config": str(folder / run_folder.CONFIG),
        "steps_logged": run_folder.steps_logged(history),
        "warm_start": state.warm_start.record() if state.warm_start is not None else None,
        "start_model_s": round(state.start_model_s, 1) if state.start_model_s is not None else None,
        "time_budget_s": job.run.time_budget_s,
        "stopped_by_time_budget_at": state.budget.stopped_at if state.budget is not None else None,
        "held_out_before_rows": state.before.rows() if state.before is not None else None,
        "held_out_after_rows": state.after.rows() if state.after is not None else None,
    }
    path = run_folder.write_result(folder, result)
    print(f"run folder: {folder} (result: {path})", flush=True)
