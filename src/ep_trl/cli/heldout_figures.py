"""What a held-out play measured: each episode (:class:`HeldOutEpisode`: its instance, the model's turns, whether each
was a well-formed action, its score), the three figures a run reports (:class:`HeldOutEpisodes`: task success, the
share of well-formed actions, success among well-formed episodes; overall, per task and per reset value), and the lines
that print them before and after (``ep_trl.cli.heldout`` plays the episodes)."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypedDict

if TYPE_CHECKING:
    from .heldout import ResetVariants


@dataclass(frozen=True)
class HeldOutEpisode:
    """One held-out episode of an environment eval: its task, the model's turns (the text it sampled), whether
    each turn's action parsed (False: the eval's action parser fell back), the eval body's score (None: unscored)
    and the episode's status (``"finished"`` or ``"error"``)."""

    task: str | None
    turns: tuple[str, ...]
    parsed: tuple[bool, ...]
    score: float | None
    status: str
    #: The episode's prompt ids and completion ids (its turns, and the observations and template between them).
    prompt_tokens: int = 0
    completion_tokens: int = 0
    #: Which instance it played: the eval row's id (an eval with its own processor), or the reset seed (OpenEnv).
    row_id: str | None = None
    seed: int | None = None
    #: Why it failed or went unscored, when it did.
    error: str | None = None
    #: Which instance it played, as the environment's reset observation said (``metadata``); None: it did not say.
    instance: Mapping[str, object] | None = None
    #: The keyword arguments its reset was given besides seed and task (``--held-out-reset-kwarg``); None: none.
    reset_kwargs: Mapping[str, object] | None = None

    @property
    def well_formed(self) -> bool:
        """Every turn's action parsed (an episode with no turn is not well formed)."""
        return bool(self.parsed) and all(self.parsed)


class HeldOutFigures(TypedDict):
    """What a run reports of its held-out episodes (:meth:`HeldOutEpisodes.figures`)."""

    success: float
    well_formed_rate: float
    success_when_well_formed: float | None
    per_task: dict[str, float]
    episodes: int


@dataclass(frozen=True)
class HeldOutEpisodes:
    """Held-out episodes and the three figures a run reports: task success, the rate of well-formed actions, and
    success among episodes whose actions all parsed (the part of success that the format alone cannot carry)."""

    episodes: tuple[HeldOutEpisode, ...]

    @property
    def success(self) -> float:
        """Mean score, an unscored episode counting 0."""
        return statistics.fmean(e.score or 0.0 for e in self.episodes) if self.episodes else 0.0

    @property
    def well_formed_rate(self) -> float:
        """Share of all model turns whose action parsed."""
        parsed = [p for e in self.episodes for p in e.parsed]
        return sum(parsed) / len(parsed) if parsed else 0.0

    @property
    def success_when_well_formed(self) -> float | None:
        """Mean score of the episodes whose actions all parsed; None when there is none."""
        formed = [e.score or 0.0 for e in self.episodes if e.well_formed]
        return statistics.fmean(formed) if formed else None

    def per_task(self) -> dict[str, float]:
        """Success per task (empty when no episode played a named task)."""
        if not any(e.task for e in self.episodes):
            return {}
        tasks = sorted({e.task or "" for e in self.episodes})
        return {t: statistics.fmean(e.score or 0.0 for e in self.episodes if (e.task or "") == t) for t in tasks}

    def per_value(self, name: str, values: Sequence[str]) -> dict[str, HeldOutFigures]:
        """The figures of the episodes whose reset was given ``name=value``, for each of ``values`` in order (those
        no episode played left out)."""
        by_value = {
            v: HeldOutEpisodes(tuple(e for e in self.episodes if (e.reset_kwargs or {}).get(name) == v)) for v in values
        }
        return {v: played.figures() for v, played in by_value.items() if played.episodes}

    def figures(self) -> HeldOutFigures:
        return {
            "success": self.success,
            "well_formed_rate": self.well_formed_rate,
            "success_when_well_formed": self.success_when_well_formed,
            "per_task": self.per_task(),
            "episodes": len(self.episodes),
        }

    def summary(self, when: str) -> str:
        """The line a run prints: the three figures (and success per task), ``when`` ("before training", ...)."""
        per_task = ", ".join(f"{task} {value:.3f}" for task, value in self.per_task().items())
        return (
            f"held-out {when}: task success {self.success:.3f}{f' ({per_task})' if per_task else ''}; "
            "well-formed actions "
            f"{self.well_formed_rate:.3f}; success among well-formed episodes "
            f"{format_figure(self.success_when_well_formed)} ({len(self.episodes)} episodes, greedy)"
        )

    def rows(self) -> list[dict[str, object]]:
        """Every episode as a result file keeps it: its instance (row id, or seed and task, where it has them, and what
        the environment's reset observation said of it), turns, whether each parsed, score, status, tokens, and the
        error of one that failed."""
        return [
            {
                **({"row_id": e.row_id} if e.row_id is not None else {}),
                **({"seed": e.seed} if e.seed is not None else {}),
                "task": e.task,
                "instance": None if e.instance is None else dict(e.instance),
                "turns": list(e.turns),
                "parsed": list(e.parsed),
                "score": e.score,
                **({"reset_kwargs": dict(e.reset_kwargs)} if e.reset_kwargs is not None else {}),
                "status": e.status,
                "prompt_tokens": e.prompt_tokens,
                "completion_tokens": e.completion_tokens,
                **({"error": e.error} if e.error is not None else {}),
            }
            for e in self.episodes
        ]


def held_out_change(before: HeldOutEpisodes, after: HeldOutEpisodes) -> str:
    """The line a run ends with: each figure before -> after."""
    change = after.success - before.success
    return (
        f"held-out task success {before.success:.3f} -> {after.success:.3f} ({change:+.3f}); well-formed "
        f"actions {before.well_formed_rate:.3f} -> {after.well_formed_rate:.3f}; success among well-formed "
        f"episodes {format_figure(before.success_when_well_formed)} -> "
        f"{format_figure(after.success_when_well_formed)}"
    )


def per_value_summary(variants: ResetVariants, played: HeldOutEpisodes, when: str) -> str:
    """One line: task success under each value of ``--held-out-reset-kwarg``."""
    figures = played.per_value(variants.name, variants.values)
    return f"held-out {when}, task success per {variants.name}: " + ", ".join(
        f"{value} {f['success']:.3f}" for value, f in figures.items()
    )


def per_value_change(variants: ResetVariants, before: HeldOutEpisodes, after: HeldOutEpisodes) -> str:
    """One line: task success under each value, before -> after."""
    first, last = (p.per_value(variants.name, variants.values) for p in (before, after))
    return f"held-out task success per {variants.name}, before -> after: " + ", ".join(
        f"{v} {format_figure(first[v]['success'] if v in first else None)} -> "
        f"{format_figure(last[v]['success'] if v in last else None)}"
        for v in variants.values
    )


def format_figure(value: float | None) -> str:
    """A figure to three decimals, or "n/a" when there is none (no well-formed episode)."""
    return "n/a" if value is None else f"{value:.3f}"
