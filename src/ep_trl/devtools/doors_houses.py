"""Which doors-game houses a run trains on and which it holds out, disjoint by construction.

A house is drawn from its reset seed (``ep_trl.envs.doors.house``). :class:`HouseSplit` draws the held-out seeds from
the run's seed (so two training seeds are two different tests) and hands training an endless stream of seeds, drawn
from the same seed, that skips every seed whose house is a held-out one. ``DoorsEnv(seeds=...)`` takes either side's
source, which the client calls at each reset that names no seed.
"""

import random
import threading
from collections.abc import Iterator
from dataclasses import dataclass

from ..envs.doors import house

#: Reset seeds are drawn from ``[0, SEEDS)``.
SEEDS = 2**31


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
        """Reset seeds for training, endless and drawn from the run's seed, never one of a held-out house."""
        rng = random.Random(f"ep_trl training doors houses, seed {self.seed}")
        excluded = {house(s) for s in self.held_out}
        while True:
            candidate = rng.randrange(SEEDS)
            if house(candidate) not in excluded:
                yield candidate

    def training_source(self) -> "SeedSource":
        return SeedSource(self.training_seeds())

    def held_out_source(self) -> "SeedSource":
        """The held-out seeds in order; raises once they are used up (a held-out set is played once)."""
        return SeedSource(iter(self.held_out), exhausted=f"all {len(self.held_out)} held-out houses were played")


class SeedSource:
    """What ``DoorsEnv(seeds=...)`` calls at each reset: the next seed of a stream. Thread-safe (eval-protocol's
    processor resets on pooled threads)."""

    def __init__(self, seeds: Iterator[int], exhausted: str = "the seed stream ended") -> None:
        self._seeds = seeds
        self._exhausted = exhausted
        self._lock = threading.Lock()

    def __call__(self) -> int:
        with self._lock:
            try:
                return next(self._seeds)
            except StopIteration:
                raise ValueError(f"{self._exhausted}: play as many episodes as the split holds out") from None
