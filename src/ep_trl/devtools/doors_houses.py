"""The doors game's held-out bookkeeping: the sign wordings a held-out set plays each house under, and the chance that
a GRPO run trains nothing (which sizes the real-model CI test).

``recipes/doors/smollm2.py`` (a preset of ``ep-trl train``) holds out reset seeds (``ep_trl.cli.heldout.SeedSplit``)
and plays each held-out house under each of :data:`PLAYED_WORDINGS` (``--held-out-reset-kwarg wording=...``).
Training resets name a seed only, so every sign it reads is in one of the two ``TRAINING_WORDINGS`` (drawn per room
from the seed). The split keeps seeds apart, not houses: two seeds draw the same doors and open doors with chance
1 / 45,158,400 (6,720 rooms of 4 of 8 colours with one open door, two rooms), so a run of G training groups meets
one of N held-out houses with chance at most G * N / 45,158,400 (3e-5 for the default 40 groups and 32 houses;
``tests/envs/test_doors.py`` checks seeds 0 to 2 over 20,000 groups). The result files of the script before it was a
preset (``benchmarks/results/smollm2_doors_*.json``) drew their held-out houses with a split of its own that skipped
every training seed whose house was a held-out one.

:class:`SeedSource` hands a client's ``DoorsEnv(seeds=...)`` a stream of seeds (or ``(seed, wording)`` pairs), for a
caller that builds its own environment factory.
"""

import threading
from collections.abc import Iterator
from typing import Generic, TypeVar

from ..envs.doors import HELD_OUT_WORDINGS, TRAINING_WORDINGS

#: The wordings a held-out set plays each house under, in this order: training's, then those training never shows.
PLAYED_WORDINGS: tuple[str, ...] = (*TRAINING_WORDINGS, *HELD_OUT_WORDINGS)

T = TypeVar("T")


class SeedSource(Generic[T]):
    """What ``DoorsEnv(seeds=...)`` calls at each reset: the next seed (or ``(seed, wording)``) of a stream.
    Thread-safe (eval-protocol's processor resets on pooled threads)."""

    def __init__(self, seeds: Iterator[T], exhausted: str = "the seed stream ended") -> None:
        self._seeds = seeds
        self._exhausted = exhausted
        self._lock = threading.Lock()

    def __call__(self) -> T:
        with self._lock:
            try:
                return next(self._seeds)
            except StopIteration:
                raise ValueError(f"{self._exhausted}: play as many episodes as the split holds out") from None


def no_gradient_chance(success: float, group_size: int, groups_per_step: int, steps: int) -> float:
    """The chance that a GRPO run of ``steps`` steps, ``groups_per_step`` groups of ``group_size`` episodes each,
    never has a non-zero gradient, when each episode independently scores 1 with chance ``success`` and else 0.

    A group gives no gradient when all its episodes score alike (all 0 or all 1: every advantage is 0), a step when
    every group does. While no step has had a gradient the weights are unchanged (TRL's GRPO defaults: no KL term,
    no weight decay, so AdamW moves nothing on a zero gradient), so every step samples from the same policy and
    ``success`` holds for all of them: ``((1 - p)^G + p^G)^(groups_per_step * steps)``.
    """
    if not 0.0 <= success <= 1.0 or min(group_size, groups_per_step, steps) < 1:
        raise ValueError(
            f"no_gradient_chance(success={success}, group_size={group_size}, groups_per_step="
            f"{groups_per_step}, steps={steps}): need 0 <= success <= 1 and sizes of 1 or more"
        )
    alike = (1.0 - success) ** group_size + success**group_size
    return float(alike ** (groups_per_step * steps))
