"""What ``ep-trl train`` (and the training scripts, its presets) print: quiet library output, one progress line per
step with a bar, the eval's score and the time left, and the closing summary with the plot.

This is command-line output, so it prints; the library itself only logs.
"""

import logging
import math
import shlex
import sys
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TextIO

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from .reward_curve import Progress, plot_scores, progress, step_scores


def quiet_library_output() -> None:
    """Ignore the libraries' deprecation warnings that are no business of a training script's user, each matched by
    category, the module that warns and the start of its message (nothing else), and turn off transformers' per-file
    progress bars (loading and saving weights). Call it before training starts: some of them warn at import."""
    # eval-protocol's __init__ puts a filter that shows its DeprecationWarnings in front of all others, and imports
    # the models that warn later (lazily): import it first, so that the filter below comes in front of that one.
    import eval_protocol  # noqa: F401
    from pydantic.warnings import PydanticDeprecatedSince20
    from transformers.utils import logging as transformers_logging

    # TRL's GRPOConfig and trainer use transformers 5's old gradient checkpointing names.
    warnings.filterwarnings(
        "ignore",
        category=FutureWarning,
        module=r"transformers\.",
        message=r"`(is_)?gradient_checkpointing(_enable|_disable)?` is deprecated",
    )
    # eval-protocol's models declare a pydantic class-based config.
    warnings.filterwarnings(
        "ignore",
        category=PydanticDeprecatedSince20,
        module=r"eval_protocol\.",
        message="Support for class-based `config` is deprecated",
    )
    transformers_logging.disable_progress_bar()


def script_logging() -> None:
    """The training scripts' output: :func:`quiet_library_output`, INFO log lines with their time and logger, the
    HTTP clients' and LiteLLM's per-request lines left out."""
    quiet_library_output()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    for noisy in ("httpx", "LiteLLM", "litellm"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


#: Characters of the progress bar at the end of each step's line.
BAR_WIDTH = 20


def bar(done: int, total: int, width: int = BAR_WIDTH) -> str:
    """``[#####...............]  25%``: how much of the run is done (``total`` <= 0: unknown, an empty bar)."""
    share = min(1.0, done / total) if total > 0 else 0.0
    filled = round(share * width)
    return f"[{'#' * filled}{'.' * (width - filled)}] {share:4.0%}"


class ProgressPrinter(TrainerCallback):
    """One line per optimizer step: reward, eval score, episodes/s, the gradient's norm (0 when every reward of a group
    is the same: nothing was learned), the time left and a bar of the run's progress. (``AsyncGRPOTrainer`` logs the
    eval score as ``reward`` only: no eval_score field then; and it logs the rollout worker's numbers with the step
    during which they arrived, so a step in which no rollout call ended has no episodes/s, failed or turns.)"""

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream or sys.stdout
        self._started = time.monotonic()

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: object
    ) -> None:
        self._started = time.monotonic()

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, float | None] | None = None,
        **kwargs: object,
    ) -> None:
        if not logs or "reward" not in logs:
            return
        step, total = state.global_step, state.max_steps
        elapsed = time.monotonic() - self._started
        eta = elapsed / step * (total - step) if step else float("nan")
        parts = [
            f"step {step}/{total}",
            f"reward {_figure(logs['reward'], '.4f')} (std {_figure(logs.get('reward_std', math.nan), '.4f')})",
            _part(logs, "rewards/eval_score/mean", "eval_score {}", ".4f"),
            _part(logs, "ep_trl/episodes_per_s", "episodes/s {}", ".2f"),
            _part(logs, "ep_trl/failed_fraction", "failed {}", ".0%"),
            _part(logs, "ep_trl/mean_turns", "turns {}", ".1f"),
            _part(logs, "grad_norm", "grad_norm {}", ".4g"),
            bar(step, total),
            f"ETA {eta:.0f}s",
        ]
        print(" | ".join(p for p in parts if p), file=self._stream, flush=True)


def _figure(value: float | None, spec: str) -> str:
    """``value`` formatted by ``spec``; ``n/a`` where the trainer logged None (a step in which every episode failed
    has no reward to average)."""
    return "n/a" if value is None else format(value, spec)


def _part(logs: Mapping[str, float | None], key: str, template: str, spec: str) -> str | None:
    """``template`` with ``logs[key]`` formatted, or None (the part is left out) where ``key`` was not logged."""
    return template.format(_figure(logs[key], spec)) if key in logs else None


def report_training(
    log_history: Sequence[Mapping[str, float]],
    plot_path: Path,
    *,
    episodes_per_step: int,
    started: float,
    title: str,
    argv: Sequence[str] | None = None,
    marks: Sequence[tuple[int, float, str]] = (),
    command: str | None = None,
) -> Progress:
    """Print the closing line (steps, episodes, the mean eval score of the first and last steps, wall time since
    ``started``), write the plot of the score per step to ``plot_path`` with the command that made it (``command``,
    else the running script with ``argv``, default its command line) and ``marks`` (``plot_scores``), and print its
    path."""
    scores = step_scores(log_history)
    summary = progress(scores)
    command = command or " ".join(
        ["python", Path(sys.argv[0]).name, *map(shlex.quote, sys.argv[1:] if argv is None else argv)]
    )
    print(
        f"done: {len(scores)} steps, {len(scores) * episodes_per_step} episodes, {summary.describe()}, "
        f"wall {time.monotonic() - started:.0f}s",
        flush=True,
    )
    path = plot_scores(scores, plot_path, title=title, note=command, marks=marks)
    print(f"reward curve: {path}", flush=True)
    return summary
