"""An episode's generator that records versions (``generation.versioned.VersionedTurns``): each turn's policy
version, the model it names per version (``generate_as``), and the most images an episode may hold (``max_images``),
checked before a turn is sent. The stream itself is driven through ``rollout_func`` and the rollout worker
(tests/adapters/test_rollout_func.py, tests/adapters/test_async_worker.py)."""

import asyncio
from typing import TYPE_CHECKING, cast

import pytest

from ep_trl import ConfigError
from ep_trl.generation import Generation, PromptImages, SamplingParams
from ep_trl.generation.versioned import VersionedTurns

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ep_trl.generation import Generator
    from ep_trl.trajectory.types import Image


class FakeGenerator:
    """A fake backend, named as such: it records the prompts it is sent (and the model each names) and answers one
    fixed token."""

    name = "fake"
    max_model_len = None
    failure = None

    def __init__(self) -> None:
        self.sent: list[tuple[list[int], PromptImages | None]] = []
        self.models: list[str | None] = []

    async def generate(
        self, prompt_ids: "Sequence[int]", params: SamplingParams, images: PromptImages | None = None
    ) -> Generation:
        return await self.generate_as(None, prompt_ids, params, images)

    async def generate_as(
        self, model: str | None, prompt_ids: "Sequence[int]", params: SamplingParams, images: PromptImages | None = None
    ) -> Generation:
        self.sent.append((list(prompt_ids), images))
        self.models.append(model)
        return Generation((5,), (-0.5,), "stop")


class Picture:
    """An image object (the check counts images by identity, as an episode holds them)."""


def test_a_turn_that_would_hold_more_than_max_images_is_not_sent() -> None:
    generator, versions = FakeGenerator(), iter([1, 2, 3])
    turns = VersionedTurns(cast("Generator", generator), lambda: next(versions), max_images=2)
    first, second, third = Picture(), Picture(), Picture()
    params = SamplingParams(max_tokens=1)

    async def turn(*images: Picture) -> Generation:
        return await turns.generate([1, 2], params, PromptImages(cast("tuple[Image, ...]", images), (1, 2)))

    asyncio.run(turn(first))
    asyncio.run(turn(first, second))  # the context re-sends the held image: 2 in all
    with pytest.raises(
        ConfigError,
        match=r"would hold 3 images, more than max_episode_images=2.*the turn is not "
        r"sent\. Pass EvalRolloutWorker\(max_episode_images=\.\.\.\)",
    ):
        asyncio.run(turn(first, second, third))
    assert len(generator.sent) == 2 and turns.versions == [1, 2]  # not sent, no version recorded
    unbounded = VersionedTurns(cast("Generator", generator), lambda: 0)  # without max_images, any number is sent
    asyncio.run(unbounded.generate([1], params, PromptImages(cast("tuple[Image, ...]", (first, second, third)), (1,))))
    assert len(generator.sent) == 3


def test_a_turn_goes_to_the_model_its_version_names() -> None:
    """With ``model_for``, each turn is generated with its version's model through the backend's ``generate_as``
    (part of the ``Generator`` protocol); a version that names none keeps the backend's own model."""
    generator, versions = FakeGenerator(), iter([1, 2])
    turns = VersionedTurns(
        cast("Generator", generator), lambda: next(versions), model_for=lambda v: "adapter-v2" if v == 2 else None
    )
    params = SamplingParams(max_tokens=1)
    asyncio.run(turns.generate([1], params))
    asyncio.run(turns.generate([1, 5, 2], params))
    assert generator.models == [None, "adapter-v2"] and turns.versions == [1, 2]
