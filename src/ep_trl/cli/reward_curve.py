"""The eval's score per optimizer step, read from a trainer's log history: its summary and its plot.

TRL's ``GRPOTrainer`` logs, per step, the mean and standard deviation over the step's episodes of each reward
function (``rewards/<name>/mean``, ``rewards/<name>/std``); with ``ep_trl.rewards.eval_score`` that is the eval body's
score. ``AsyncGRPOTrainer`` logs no per-function rewards: with ep_trl's ``EvalRolloutWorker`` its ``reward`` is the
mean eval score of the step's trained samples and ``reward_std`` the mean, over those samples, of their group's
standard deviation; a log history without ``rewards/<name>/mean`` is read through those two.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

#: The reward function whose logged score is read (``ep_trl.rewards.eval_score``).
REWARD_NAME = "eval_score"


@dataclass(frozen=True)
class StepScore:
    """The eval's score at one optimizer step: mean and standard deviation over the step's episodes."""

    step: int
    mean: float
    std: float


@dataclass(frozen=True)
class Progress:
    """Mean score of the first and of the last ``window`` steps (a fifth of the run, at least one step)."""

    first: float
    last: float
    window: int
    steps: int

    def describe(self) -> str:
        """``reward first X last Y (mean eval score of steps 1-4 and 17-20)``."""
        return (
            f"reward first {self.first:.4f} last {self.last:.4f} (mean eval score of steps "
            f"{_span(1, self.window)} and {_span(self.steps - self.window + 1, self.steps)})"
        )


def step_scores(log_history: Sequence[Mapping[str, float]], reward_name: str = REWARD_NAME) -> tuple[StepScore, ...]:
    """The logged score of every step that has one, in step order: ``rewards/<reward_name>/mean`` and ``/std``, or,
    when no entry has those (``AsyncGRPOTrainer``), ``reward`` and ``reward_std``."""
    mean_key, std_key = f"rewards/{reward_name}/mean", f"rewards/{reward_name}/std"
    if not any(mean_key in entry for entry in log_history):
        mean_key, std_key = "reward", "reward_std"
    return tuple(
        StepScore(step=int(entry["step"]), mean=float(entry[mean_key]), std=float(entry.get(std_key, 0.0)))
        for entry in log_history
        if mean_key in entry
    )


def progress(scores: Sequence[StepScore]) -> Progress:
    """Mean score of the first and last fifth of the steps."""
    if not scores:
        raise ValueError("no step logged a score: nothing to summarise (did training run a step?)")
    window = max(1, len(scores) // 5)
    first = sum(s.mean for s in scores[:window]) / window
    last = sum(s.mean for s in scores[-window:]) / window
    return Progress(first=first, last=last, window=window, steps=len(scores))


def plot_scores(
    scores: Sequence[StepScore],
    path: str | Path,
    *,
    title: str,
    note: str = "",
    marks: Sequence[tuple[int, float, str]] = (),
) -> Path:
    """Write a PNG of the mean score per step with a band of one standard deviation (clipped to [0, 1]) to
    ``path``; ``note`` is printed under the plot (e.g. the command that made it); ``marks`` are single scores drawn
    as labelled points, ``(step, score, label)`` (a held-out score before and after training, say)."""
    try:
        import matplotlib
    except ImportError as exc:
        raise RuntimeError(
            f"plotting the reward curve needs matplotlib ({exc}): pip install 'ep-trl[demo]' "
            "(bash scripts/install.sh installs it)"
        ) from exc
    matplotlib.use("Agg")  # files only: no display, no GUI toolkit
    from matplotlib import pyplot as plt
    from matplotlib.ticker import MaxNLocator

    if not scores:
        raise ValueError("no step logged a score: nothing to plot")
    steps = [s.step for s in scores]
    means = [s.mean for s in scores]
    low = [max(0.0, s.mean - s.std) for s in scores]
    high = [min(1.0, s.mean + s.std) for s in scores]
    summary = progress(scores)
    figure, axes = plt.subplots(figsize=(7, 4), dpi=120)
    try:
        axes.fill_between(steps, low, high, alpha=0.2, label="± 1 std over the step's episodes")
        axes.plot(steps, means, marker="o", markersize=3, label="mean eval score")
        for at, value, name in (
            (scores[: summary.window], summary.first, "first"),
            (scores[-summary.window :], summary.last, "last"),
        ):
            axes.hlines(value, at[0].step, at[-1].step, colors="black", linestyles="dashed", linewidth=1)
            axes.annotate(
                f"{name} {value:.2f}", (at[0].step, value), textcoords="offset points", xytext=(0, 6), fontsize=8
            )
        for step, value, label in marks:
            axes.plot([step], [value], marker="D", color="tab:red", linestyle="none")
            left = step > steps[-1] / 2  # a label past the middle is written leftwards, inside the axes
            axes.annotate(
                f"{label} {value:.2f}",
                (step, value),
                textcoords="offset points",
                xytext=(-4 if left else 4, -12),
                ha="right" if left else "left",
                fontsize=8,
                color="tab:red",
            )
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))
        axes.set_xlabel("optimizer step")
        axes.set_ylabel("eval score")
        axes.set_ylim(-0.02, 1.1)  # room above a score of 1.0 for its label
        axes.set_title(title, fontsize=10)
        axes.grid(alpha=0.3)
        axes.legend(loc="lower right", fontsize=8)
        if note:
            figure.text(0.01, 0.01, note, fontsize=6, family="monospace", va="bottom")
            figure.subplots_adjust(bottom=0.2)
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(out)
    finally:
        plt.close(figure)
    return out


def _span(start: int, end: int) -> str:
    return str(start) if start == end else f"{start}-{end}"
