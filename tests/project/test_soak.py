"""A short soak (benchmarks/soak.py): many rollout calls, faults mixed in, and nothing grows from call to call."""

from pathlib import Path

import pytest

from benchmarks.soak import soak


@pytest.mark.timeout(600)
def test_descriptors_threads_children_and_memory_stay_flat_over_many_calls(tmp_path: Path) -> None:
    samples = soak(calls=10, episodes=4, faults=True, work=tmp_path)
    assert all(s["failed"] == 2 for s in samples)  # the crashing task's group fails every call
    settled, last = samples[2], samples[-1]  # after warm-up (imports, first sessions, caches)
    assert last["fds"] - settled["fds"] <= 2, samples
    assert last["threads"] == settled["threads"], samples
    assert last["children"] == settled["children"], samples  # the letters server (and the suite's own servers)
    assert last["rss_kb"] - settled["rss_kb"] < 64 * 1024, samples
