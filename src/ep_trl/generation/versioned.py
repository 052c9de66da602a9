"""An episode's view of the stream's generator that records the policy version of each turn (``VersionedTurns``).

The async worker's stream (``ep_trl.engine.stream.stream_groups`` with ``turn_version``) hands each episode one, so
that every sample knows the version its turns were generated under and, when the trainer syncs LoRA adapters, each
turn goes to the adapter of that version (``Generator.generate_as``). It wraps any backend: it is a ``Generator``
itself, and the shared backend stays the stream owner's to begin, end and close.
"""

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from ..errors import ConfigError, GenerationError
from . import Generation, Generator, PromptImages, SamplingParams

if TYPE_CHECKING:
    from ..trajectory.types import Image


class VersionedTurns:
    """The stream's generator as one episode sees it: every turn goes to ``generator``, and the policy version read
    from ``version()`` just before the turn is sent is recorded. ``model_for(version)`` may name the served model
    (a LoRA adapter of that version) the turn must be generated with; None keeps the generator's own.
    ``max_images``: the most images the episode may hold (every image its turns were sent with, each once); a turn
    that would pass it is not sent and raises ``ConfigError``."""

    def __init__(
        self,
        generator: Generator,
        version: Callable[[], int],
        model_for: Callable[[int], str | None] | None = None,
        max_images: int | None = None,
    ) -> None:
        self._generator = generator
        self._version = version
        self._model_for = model_for
        self._max_images = max_images
        #: The images the episode's turns were sent with, by identity (its trajectory holds them anyway; a
        #: processor's conversation that starts over keeps the earlier one's too).
        self._images: "dict[int, Image]" = {}
        self.versions: list[int] = []

    @property
    def name(self) -> str:
        return self._generator.name

    @property
    def max_model_len(self) -> int | None:
        return self._generator.max_model_len

    @property
    def failure(self) -> GenerationError | None:
        return self._generator.failure

    async def begin_call(self) -> None:
        """The stream's owner begins and ends the shared generator, not an episode."""

    async def end_call(self) -> None:
        """See ``begin_call``."""

    async def aclose(self) -> None:
        """The shared generator is closed by its owner."""

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, images: PromptImages | None = None
    ) -> Generation:
        """The turn, sent under the policy version read now (with that version's model when ``model_for`` names
        one)."""
        self._check_images(images)
        version = self._version()
        self.versions.append(version)
        model = self._model_for(version) if self._model_for is not None else None
        if model is None:
            return await self._generator.generate(prompt_ids, params, images)
        return await self._generator.generate_as(model, prompt_ids, params, images)

    async def generate_as(
        self, model: str, prompt_ids: Sequence[int], params: SamplingParams, images: PromptImages | None = None
    ) -> Generation:
        """``generate`` with ``model`` named by the episode rather than by the turn's version (which is still
        recorded)."""
        self._check_images(images)
        self.versions.append(self._version())
        return await self._generator.generate_as(model, prompt_ids, params, images)

    def _check_images(self, images: PromptImages | None) -> None:
        """Count the turn's images in the episode's; more than ``max_images`` in all: ``ConfigError``, not sent."""
        if self._max_images is not None and images is not None:
            self._images.update((id(image), image) for image in images.images)
            if len(self._images) > self._max_images:
                raise ConfigError(
                    f"An episode's turn would hold {len(self._images)} images, more than max_episode_images="
                    f"{self._max_images}, the most one episode may hold (the images reserved for it while it plays): "
                    "the turn is not sent. Pass EvalRolloutWorker(max_episode_images=...) at least the most images "
                    "one episode of this eval holds (its prompt's and every turn's), and max_buffered_images at "
                    "least num_generations times that."
                )
