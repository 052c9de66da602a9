"""Which MiniWoB++ task instances a run trains on and which it holds out, disjoint by construction.

A MiniWoB page is drawn in the browser from a page seed, ``Math.seedrandom(s)`` with ``s`` in ``[0, 1_000_000)``, and
BrowserGym draws ``s`` as the first ``randint(0, 1_000_000)`` of ``numpy.random.RandomState(seed)``, where ``seed``
is the one ``reset(seed=...)`` was given (``browsergym/miniwob/base.py``, pinned by
``tests/devtools/test_miniwob_instances.py`` against a real browser). Two reset seeds can therefore show the same
page; a held-out instance is a page seed, not a reset seed.

:class:`InstanceSplit` draws the held-out reset seeds from the run's seed (so two training seeds are two different
tests), and hands training an endless stream of reset seeds, also drawn from the run's seed, that skips every seed
whose page seed is held out: training never sees a held-out page. ``BrowserGymEnv(seeds=...)`` takes either side's
:class:`SeedSource`, which a client calls at each reset that names no seed. ``recipes/miniwob/smollm2.py`` drew its
held-out pages this way until it became a preset of ``ep-trl train``, whose ``SeedSplit`` keeps reset seeds apart
rather than pages (its result files in ``benchmarks/results/`` were drawn with :class:`InstanceSplit`); the preset
uses :func:`page_seed` to keep its warm-start pages off the held-out ones.
"""

import random
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

#: MiniWoB page seeds are drawn from ``[0, PAGE_SEEDS)``.
PAGE_SEEDS = 1_000_000
#: Reset seeds are drawn from ``[0, RESET_SEEDS)`` (numpy's ``RandomState`` takes seeds below 2**32).
RESET_SEEDS = 2**31


def page_seed(reset_seed: int) -> int:
    """The MiniWoB page seed BrowserGym draws for ``reset(seed=reset_seed)``."""
    return int(np.random.RandomState(reset_seed).randint(0, PAGE_SEEDS))


@dataclass(frozen=True)
class InstanceSplit:
    """Held-out reset seeds per task (``count`` each, distinct pages) and the training seed stream around them."""

    seed: int
    held_out: Mapping[str, tuple[int, ...]]

    @classmethod
    def draw(cls, seed: int, tasks: Sequence[str], count: int) -> "InstanceSplit":
        """``count`` held-out reset seeds for each of ``tasks``, drawn from ``seed``; no two show the same page."""
        if count < 1 or not tasks:
            raise ValueError(
                f"InstanceSplit.draw(tasks={list(tasks)!r}, count={count}): give one or more tasks and a "
                "count >= 1 of held-out instances per task"
            )
        rng = random.Random(f"ep_trl held-out MiniWoB instances, seed {seed}")
        pages: set[int] = set()
        held_out: dict[str, tuple[int, ...]] = {}
        for task in tasks:
            chosen: list[int] = []
            while len(chosen) < count:
                candidate = rng.randrange(RESET_SEEDS)
                page = page_seed(candidate)
                if page not in pages:
                    pages.add(page)
                    chosen.append(candidate)
            held_out[task] = tuple(chosen)
        return cls(seed=seed, held_out=held_out)

    @property
    def held_out_pages(self) -> frozenset[int]:
        return frozenset(page_seed(s) for seeds in self.held_out.values() for s in seeds)

    def training_seeds(self) -> Iterator[int]:
        """Reset seeds for training, endless and drawn from the run's seed, never one of a held-out page."""
        rng = random.Random(f"ep_trl training MiniWoB instances, seed {self.seed}")
        excluded = self.held_out_pages
        while True:
            candidate = rng.randrange(RESET_SEEDS)
            if page_seed(candidate) not in excluded:
                yield candidate


@dataclass
class SeedSource:
    """What a ``BrowserGymEnv(seeds=...)`` calls with the task name at each reset that names no seed: the next
    training seed whatever the task (:meth:`training`), or the next held-out seed of that task (:meth:`held_out`,
    which raises once a task's are used up: a held-out set is played once). Thread-safe: eval-protocol's processor
    resets on pooled threads."""

    _training: Iterator[int] | None = None
    _held_out: dict[str, list[int]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def training(cls, split: InstanceSplit) -> "SeedSource":
        return cls(_training=split.training_seeds())

    @classmethod
    def held_out(cls, split: InstanceSplit) -> "SeedSource":
        return cls(_held_out={task: list(seeds) for task, seeds in split.held_out.items()})

    def __call__(self, task: str | None) -> int:
        with self._lock:
            if self._training is not None:
                return next(self._training)
            remaining = self._held_out.get(task or "")
            if remaining is None:
                raise ValueError(
                    f"no held-out instances of task {task!r}: the split holds out {sorted(self._held_out)}"
                )
            if not remaining:
                raise ValueError(
                    f"every held-out instance of task {task!r} was played already: a held-out set is "
                    "played once; play as many episodes of each task as it has instances"
                )
            return remaining.pop(0)
