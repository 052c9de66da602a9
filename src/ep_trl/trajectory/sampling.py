"""One turn's exchange with a generation backend, as plain values: what it asks (:class:`SamplingParams`, the prompt's
ids as :class:`PromptIds`, its images as :class:`PromptImages`) and what comes back (:class:`Generation`).

They live here, below the backends (``ep_trl.generation``, which re-exports them as its interface), because the
trajectory builder (``tokens``) records them and every backend returns them: the builder needs no backend.
"""

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # named for the checker
    from .types import Image


#: Tokens per turn when the eval sets no ``max_tokens`` (``OpenEnvRolloutProcessor``'s own default).
DEFAULT_MAX_TOKENS = 100


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings for one turn. Temperature/top-p/top-k come from the GRPOConfig; max_tokens and stop
    from the eval's completion params (clipped to the episode's remaining token budget)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    max_tokens: int = DEFAULT_MAX_TOKENS
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()

    def with_max_tokens(self, max_tokens: int) -> "SamplingParams":
        """These settings with ``max_tokens`` (themselves when it is theirs already: most turns)."""
        return self if max_tokens == self.max_tokens else replace(self, max_tokens=max_tokens)


@dataclass(frozen=True)
class Generation:
    """One sampled continuation: its ids, one logprob per id, and why it stopped ("stop" or "length")."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: str
    stop_text: str | None = None

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.logprobs):
            raise ValueError(
                f"backend returned {len(self.token_ids)} token ids but {len(self.logprobs)} logprobs; they must align"
            )


@dataclass(frozen=True)
class PromptImages:
    """The images of one prompt, for a vision-language model.

    ``images`` are the prompt's images in placeholder order (PIL images). The ``prompt_ids`` a backend receives hold
    each image's placeholder expanded into the image's tokens (what the model attends to and TRL scores);
    ``unexpanded_ids`` are the same prompt with each placeholder as the chat template wrote it. A vLLM engine
    expands placeholders itself from the images, so it takes ``unexpanded_ids`` with the images (offline:
    ``{"prompt_token_ids": unexpanded_ids, "multi_modal_data": {"image": list(images)}}``; a server:
    ``/inference/v1/generate``), and the prompt ids it reports back must equal ``prompt_ids``. A backend that cannot
    take images raises, naming what to do: a text-only turn never carries this.
    """

    images: "tuple[Image, ...]"
    unexpanded_ids: tuple[int, ...]


class PromptIds(list):
    """Prompt ids (a plain list to every backend) that also carry their JSON text, ``json``: what
    ``json.dumps([int(t) for t in ids], separators=(",", ":"))`` gives. ``TrajectoryBuilder.held_ids()`` returns one,
    keeping the text as the held ids grow, so a server backend sends a turn's prompt without converting and encoding
    every id of the conversation again (``generation.vllm``)."""

    __slots__ = ("json",)

    def __init__(self, ids: Sequence[int], json_text: str) -> None:
        super().__init__(ids)
        self.json = json_text


def ids_json(ids: Sequence[int]) -> str:
    """``ids`` as a compact JSON array of integers (each converted with ``int``, as a request body takes them)."""
    return json.dumps([int(t) for t in ids], separators=(",", ":"))
