"""The version check the asynchronous training tests share (``check_turn_versions``, tests/support/async_training.py)
passes a run that keeps the rule and fails each deliberately broken one, without a server: a sample tagged with its
newest turn's version, a turn whose logprobs are neither its recorded version's nor the next one's, a run whose turns
no two adjacent versions tell apart, and one sync holding more turns than there are slots while the total stays under
syncs x slots (all the VLM test bounded before issue 48). The gaps are synthetic: each turn's per-token |sampled -
teacher-forced| logprob under its recorded version and the next one."""

import dataclasses
from typing import TYPE_CHECKING

import pytest

from tests.support.async_training import SampleTurns, TurnGaps, check_turn_versions

if TYPE_CHECKING:
    from collections.abc import Sequence

TOLERANCE = 1e-3
SLOTS, SYNCS = 2, 4  # versions 1 to 4: the first sync, then one per step


def own(version: int) -> TurnGaps:
    """A turn its recorded version sampled, which the next version would not have."""
    return TurnGaps(version, (0.0, 1e-5), (0.2, 0.4))


def next_ones(version: int) -> TurnGaps:
    """A turn sent while the version still read ``version``, sampled on the next one's weights (the sync race)."""
    return TurnGaps(version, (0.2, 0.4), (1e-5, 0.0))


def both(version: int) -> TurnGaps:
    """A turn of near-certain tokens: both versions match it, neither tells it apart."""
    return TurnGaps(version, (0.0, 0.0), (0.0, 0.0))


def held(version: int) -> TurnGaps:
    """A turn in flight when the sync away from ``version`` paused the server: its first token is ``version``'s, the
    rest neither policy's alone."""
    return TurnGaps(version, (0.0, 0.3, 0.5), (0.1, 0.2, 0.6))


def neither(version: int) -> TurnGaps:
    """A turn sampled by a policy two versions on, or by no policy synced: no token matches either version."""
    return TurnGaps(version, (0.2, 0.3), (0.3, 0.2))


GOOD = (
    SampleTurns(1, (own(1), own(1))),
    SampleTurns(1, (own(1), own(2))),  # spans the sync to version 2: tagged with its oldest turn's version
    SampleTurns(1, (next_ones(1),)),  # recorded one older than the weights that sampled it
    SampleTurns(2, (own(2), held(2))),
    SampleTurns(3, (both(3), held(3))),
    SampleTurns(2, (held(2),)),  # two turns held at the sync from 2 to 3: one per slot
)


def test_a_run_that_keeps_the_rule_passes_with_its_counts() -> None:
    check = check_turn_versions(GOOD, SLOTS, TOLERANCE)
    assert (check.turns, check.told_apart) == (7, 6)
    assert dict(check.held) == {2: 2, 3: 1}
    assert dict(check.exact) == {1: 1, 2: 3, 3: 4}


def tagged_with_its_newest_turns_version(samples: "Sequence[SampleTurns]") -> list[SampleTurns]:
    return [dataclasses.replace(samples[1], model_version=2), *samples[2:]]


def a_turn_matching_neither_version(samples: "Sequence[SampleTurns]") -> list[SampleTurns]:
    return [*samples, SampleTurns(2, (own(2), neither(2)))]


def no_turn_told_apart(samples: "Sequence[SampleTurns]") -> list[SampleTurns]:
    return [
        SampleTurns(s.model_version, tuple(t if t == held(t.version) else both(t.version) for t in s.turns))
        for s in samples
    ]


def three_turns_held_at_one_sync(samples: "Sequence[SampleTurns]") -> list[SampleTurns]:
    return [*samples, SampleTurns(2, (own(2), held(2)))]


BROKEN = {
    "tagged with its newest turn's version": (
        tagged_with_its_newest_turns_version,
        "is tagged 2, its turns were "
        r"sampled by \[1, 2\]",
    ),
    "a turn matching neither version": (a_turn_matching_neither_version, "matches neither"),
    "no turn told apart": (no_turn_told_apart, "tell only 0 of 7 turns apart"),
    "one sync holding more turns than slots": (three_turns_held_at_one_sync, r"turns held per sync \{2: 3, 3: 1\}"),
}


@pytest.mark.parametrize("broken", BROKEN)
def test_a_broken_rule_fails_the_check(broken: str) -> None:
    """Each broken run fails with the message that names what broke; the run it was made from passes."""
    breaking, message = BROKEN[broken]
    with pytest.raises(AssertionError, match=message):
        check_turn_versions(breaking(GOOD), SLOTS, TOLERANCE)


def test_more_held_turns_at_one_sync_than_slots_pass_a_bound_on_the_total_only() -> None:
    """The bound the VLM test had (total held <= syncs x slots) passes the run with three turns held at one sync of a
    worker with two slots; the per-sync limit fails it."""
    samples = three_turns_held_at_one_sync(GOOD)
    total = sum(turn == held(turn.version) for sample in samples for turn in sample.turns)
    assert total == 4 <= SYNCS * SLOTS
    with pytest.raises(AssertionError, match="more than 2 slots"):
        check_turn_versions(samples, SLOTS, TOLERANCE)
