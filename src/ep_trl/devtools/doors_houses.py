"""Which doors-game houses and sign wordings a run trains on and which it holds out, disjoint by construction.

A house is drawn from its reset seed (``ep_trl.envs.doors.house``). :class:`HouseSplit` draws the held-out seeds from
the run's seed (so two training seeds are two different tests) and hands training an endless stream of seeds, drawn
from the same seed, that skips every seed whose house is a held-out one. Training resets name a seed only, so every
sign it reads is in one of the two ``TRAINING_WORDINGS`` (drawn per room from the seed); the held-out set plays each
held-out house once under each wording, the training ones and the ``HELD_OUT_WORDINGS`` that training never shows
(two of which name only the locked doors). ``DoorsEnv(seeds=...)`` takes either side's source, which the client calls
at each reset that names no seed.

Each episode's row records the house it played (``instance``: ``{"seed": ..., "wording": ...}``, from the reset
observation), so :func:`per_wording` can split held-out figures by wording and before and after can be paired house
by house.
"""

import random
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from ..cli.heldout import HeldOutEpisodes, HeldOutFigures
from ..envs.doors import HELD_OUT_WORDINGS, LOCKED_ONLY_WORDINGS, TRAINING_WORDINGS, house

#: Reset seeds are drawn from ``[0, SEEDS)``.
SEEDS = 2**31
#: The wordings a held-out set plays each house under, in this order: training's, then those training never shows.
PLAYED_WORDINGS: tuple[str, ...] = (*TRAINING_WORDINGS, *HELD_OUT_WORDINGS)

T = TypeVar("T")


@dataclass(frozen=True)
class HouseSplit:
    """Held-out reset seeds (distinct houses) and the training seed stream around them."""

    seed: int
    held_out: tuple[int, ...]

    @classmethod
    def draw(cls, seed: int, count: int) -> "HouseSplit":
        if count < 1:
            raise ValueError(f"HouseSplit.draw(count={count}): hold out one house or more")
        rng = random.Random(f"ep_trl held-out doors houses, seed {seed}")
        chosen: list[int] = []
        houses: set[object] = set()
        while len(chosen) < count:
            candidate = rng.randrange(SEEDS)
            if house(candidate) not in houses:
                houses.add(house(candidate))
                chosen.append(candidate)
        return cls(seed=seed, held_out=tuple(chosen))

    def training_seeds(self) -> Iterator[int]:
        """Reset seeds for training, endless and drawn from the run's seed, never one of a held-out house. A seed
        alone: the house's signs take the training wordings."""
        rng = random.Random(f"ep_trl training doors houses, seed {self.seed}")
        excluded = {house(s) for s in self.held_out}
        while True:
            candidate = rng.randrange(SEEDS)
            if house(candidate) not in excluded:
                yield candidate

    def held_out_plays(self) -> tuple[tuple[int, str], ...]:
        """The held-out episodes as ``(seed, wording)``: every held-out house under each of :data:`PLAYED_WORDINGS`,
        wording by wording."""
        return tuple((seed, wording) for wording in PLAYED_WORDINGS for seed in self.held_out)

    def training_source(self) -> "SeedSource[int]":
        return SeedSource(self.training_seeds())

    def held_out_source(self) -> "SeedSource[tuple[int, str]]":
        """The held-out plays in order; raises once they are used up (a held-out set is played once)."""
        plays = self.held_out_plays()
        return SeedSource(iter(plays), exhausted=f"all {len(plays)} held-out plays ({len(self.held_out)} houses x "
                                                 f"{len(PLAYED_WORDINGS)} wordings) were played")


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


def per_wording(played: HeldOutEpisodes) -> dict[str, HeldOutFigures]:
    """The held-out figures of each wording, from the wording each episode's reset reported (``instance``), in
    :data:`PLAYED_WORDINGS` order. An episode that recorded no wording (its reset failed) cannot be placed: an
    error, as its figure would otherwise go missing from every wording."""
    unplaced = [i for i, e in enumerate(played.episodes) if not e.instance or e.instance.get("wording") is None]
    if unplaced:
        raise ValueError(f"held-out episodes {unplaced} recorded no sign wording (their reset reported no instance); "
                         "per-wording figures need every episode's")
    by_wording = {w: HeldOutEpisodes(tuple(e for e in played.episodes if e.instance and e.instance["wording"] == w))
                  for w in PLAYED_WORDINGS}  # every episode has an instance here; the test is for the type checker
    return {w: episodes.figures() for w, episodes in by_wording.items() if episodes.episodes}


def per_wording_summary(figures: dict[str, HeldOutFigures], when: str) -> str:
    """One line: success per wording (held-out wordings marked *; those naming only locked doors marked !)."""
    def mark(w: str) -> str:
        return w + ("*!" if w in LOCKED_ONLY_WORDINGS else "*" if w in HELD_OUT_WORDINGS else "")

    return (f"held-out {when}, success per sign wording (* never in training, ! names only locked doors): "
            + ", ".join(f"{mark(w)} {f['success']:.3f}" for w, f in figures.items()))


def no_gradient_chance(success: float, group_size: int, groups_per_step: int, steps: int) -> float:
    """The chance that a GRPO run of ``steps`` steps, ``groups_per_step`` groups of ``group_size`` episodes each,
    never has a non-zero gradient, when each episode independently scores 1 with chance ``success`` and else 0.

    A group gives no gradient when all its episodes score alike (all 0 or all 1: every advantage is 0), a step when
    every group does. While no step has had a gradient the weights are unchanged (TRL's GRPO defaults: no KL term,
    no weight decay, so AdamW moves nothing on a zero gradient), so every step samples from the same policy and
    ``success`` holds for all of them: ``((1 - p)^G + p^G)^(groups_per_step * steps)``.
    """
    if not 0.0 <= success <= 1.0 or min(group_size, groups_per_step, steps) < 1:
        raise ValueError(f"no_gradient_chance(success={success}, group_size={group_size}, groups_per_step="
                         f"{groups_per_step}, steps={steps}): need 0 <= success <= 1 and sizes of 1 or more")
    alike = (1.0 - success) ** group_size + success ** group_size
    return float(alike ** (groups_per_step * steps))
