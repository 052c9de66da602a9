"""What a run leaves in its run folder when it ends, however it ends: the state the run gathered (:class:`RunState`),
``config.yaml``'s content, and the closing summary, the plot and ``result.json`` (written by the main process)."""

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from . import run_folder
from .arguments import PROG, TrainJob
from .ranks import Ranks

if TYPE_CHECKING:
    from transformers import Trainer
    from trl import GRPOConfig
    from trl.experimental.async_grpo import AsyncGRPOConfig

    from ..devtools.run_record import RunStart
    from .heldout import HeldOutPlay
    from .heldout_figures import HeldOutEpisodes
    from .time_budget import TimeBudget
    from .warm_start import WarmStartReport


@dataclass
class RunState:
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


def resolved_config(job: TrainJob, model: str, config: "GRPOConfig | AsyncGRPOConfig") -> dict[str, object]:
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


def finish(job: TrainJob, folder: Path, state: RunState, record: "RunStart", started: float, ranks: Ranks) -> None:
    """The closing summary, the plot and ``result.json``, from what was logged (none of them when no step was)."""
    from ..devtools import run_record
    from .heldout_figures import held_out_change, per_value_change
    from .progress import report_training
    from .reward_curve import step_scores

    history = list(state.trainer.state.log_history) if state.trainer is not None else []
    steps = step_scores(history)
    values = job.config_values
    per_step = (
        int(values.get("per_device_train_batch_size") or 8)
        * int(values.get("gradient_accumulation_steps") or 1)
        * ranks.world_size
    )
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
