"""Held-out MiniWoB instances: disjoint from training by page, different per training seed, played once; and the
page-seed derivation they rest on, pinned against a real browser."""

import asyncio
import itertools
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from ep_trl.devtools.miniwob_instances import InstanceSplit, SeedSource, page_seed
from ep_trl.envs.browsergym import BrowserGymEnv
from tests.support.browsergym import browsergym_server

if TYPE_CHECKING:
    from ep_trl.envs.browsergym import BrowserGymObservation, BrowserGymState

TASKS = ("click-button", "enter-text")
#: A reset seed that shows the same MiniWoB page as reset seed 12345 (found by search; checked below).
TWIN_OF_12345 = 340170


def test_training_never_draws_a_held_out_page_and_each_seed_holds_out_its_own_set() -> None:
    split = InstanceSplit.draw(0, TASKS, 16)
    assert [len(split.held_out[t]) for t in TASKS] == [16, 16]
    assert len(split.held_out_pages) == 32  # 32 distinct pages
    training = list(itertools.islice(split.training_seeds(), 2_000))
    assert not {page_seed(s) for s in training} & split.held_out_pages
    assert training == list(itertools.islice(split.training_seeds(), 2_000))  # reproducible from the seed
    other = InstanceSplit.draw(1, TASKS, 16)
    assert not other.held_out_pages & split.held_out_pages


def test_the_held_out_seeds_of_the_browsergym_preset_keep_their_pages_out_of_the_first_training_groups() -> None:
    """``ep-trl train --held-out`` (which ``recipes/miniwob/smollm2.py`` runs) keeps reset seeds apart, not pages: a
    training group shows one of 32 held-out pages with chance 32 / 1,000,000. On the preset's held-out sets (16 per
    task, seeds 0 and 1) the pages are distinct and none of the first 2,000 training groups (a default run plays 40)
    shows one of them."""
    from ep_trl.cli.heldout import SeedSplit

    for seed in (0, 1):
        split = SeedSplit.draw(seed, 32)
        pages = {page_seed(s) for s in split.held_out}
        assert len(pages) == 32
        assert not {page_seed(split.training_seed(group)) for group in range(2_000)} & pages


def test_a_training_stream_skips_every_reset_seed_whose_page_is_held_out() -> None:
    free = list(itertools.islice(InstanceSplit(seed=0, held_out={}).training_seeds(), 6))
    # hold out the page the free stream draws first and third: the same stream skips exactly those
    split = InstanceSplit(seed=0, held_out={"click-button": (TWIN_OF_12345,), "enter-text": (free[0], free[2])})
    assert list(itertools.islice(split.training_seeds(), 4)) == [free[1], *free[3:]]
    assert page_seed(TWIN_OF_12345) == page_seed(12345)  # a held-out page, whichever reset seed would show it


def test_a_held_out_source_hands_each_instance_once_per_task_across_threads() -> None:
    split = InstanceSplit.draw(3, TASKS, 8)
    source = SeedSource.held_out(split)
    got: list[tuple[str, int]] = []
    lock = threading.Lock()

    def take(task: str) -> None:
        for _ in range(4):
            seed = source(task)
            with lock:
                got.append((task, seed))

    threads = [threading.Thread(target=take, args=(t,)) for t in TASKS for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for task in TASKS:
        assert sorted(s for tk, s in got if tk == task) == sorted(split.held_out[task])
    with pytest.raises(ValueError, match="played already"):
        source("click-button")
    with pytest.raises(ValueError, match="no held-out instances of task 'focus-text'"):
        source("focus-text")


def test_page_seed_is_the_page_browsergym_shows_and_the_client_resets_to_the_source_s_seed(tmp_path: Path) -> None:
    """Two reset seeds with one page seed show the same page in a real browser; the client's ``seeds`` picks the
    reset's seed when the reset names none (the server echoes it in its state)."""
    first, twin, other = 12345, TWIN_OF_12345, 12346
    assert page_seed(other) != page_seed(first)
    asked: list[str | None] = []

    def seeds(task: str | None) -> int:
        asked.append(task)
        return twin

    async def pages(url: str) -> "tuple[list[BrowserGymObservation], BrowserGymState]":
        env = BrowserGymEnv(base_url=url)
        seeded = BrowserGymEnv(base_url=url, seeds=seeds)
        try:
            shown = [(await env.reset(task_name="click-button", seed=s)).observation for s in (first, other)]
            result = await seeded.reset(task_name="click-button")
            state = await seeded.state()
            return shown + [result.observation], state
        finally:
            await env.close()
            await seeded.close()

    with browsergym_server(tmp_path) as server:
        (a, b, c), state = asyncio.run(pages(server.base_url))
    assert asked == ["click-button"] and state.seed == twin
    assert (c.goal, c.axtree_txt) == (a.goal, a.axtree_txt)
    assert (b.goal, b.axtree_txt) != (a.goal, a.axtree_txt)
