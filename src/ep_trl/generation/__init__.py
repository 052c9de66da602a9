"""Generation backends: what every backend takes and returns, so episodes and the rollout never ask which one runs.

One module per backend, each implementing :class:`Generator`, and the modules that serve them:

* ``trainer`` (backend): in-process, with ``trainer.model``;
* ``vllm`` (backend): a vLLM server;
* ``colocate`` (backend): TRL's vLLM engine inside the trainer's process (``vllm_mode="colocate"``);
* ``choice``: picks and builds one for a rollout call;
* ``batching``: the queue and thread that serve an in-process model's turns in batches (``trainer``, ``colocate``);
* ``versioned``: an episode's view of a backend that records each turn's policy version;
* ``probe``: asking a vLLM server what it serves, without a backend.

A backend receives the exact token ids the model must condition on and returns the ids it sampled with the
log-probability of each sampled token at the trainer's temperature, the quantity TRL's loss and
importance-sampling ratio compare against. Nothing is decoded and re-encoded on the way.

For a vision-language model a turn also carries its images (:class:`PromptImages`): the prompt ids then hold every
image's expanded tokens, as the processing class expands them, and the backend gives the model the images' pixels. A
text-only turn carries ``images=None``.
"""

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol, Sequence

from ..errors import ConfigError, GenerationError

if TYPE_CHECKING:  # named for the checker; the caller builds them
    from trl import GRPOTrainer

    from ..engine.caller import SyncedServer
    from ..options import VLLMOptions
    from ..trajectory.types import Image, Model, ProcessingClass


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


@dataclass(frozen=True)
class BackendOffer:
    """What a rollout's caller offers to generate with (the trainer whose colocated engine generates, the server it
    keeps on its weights, its model in this process, an explicit server URL), with the options a backend is built
    with. ``generation.choice`` picks a backend by it and hands it to that backend module's ``build(offer)``."""

    vllm_base_url: str | None
    options: "VLLMOptions"
    max_concurrent_rollouts: int
    colocated_trainer: "GRPOTrainer | None"
    server: "SyncedServer | None"
    model_provider: "Callable[[], Model] | None"
    processing_class: "ProcessingClass"


class Generator(Protocol):
    """A generation backend. Implementations must be safe to call from many episodes at once.

    ``failure`` is the error that made the backend unusable for the rest of a rollout call (for a server: one
    request failed for good), after which every request fails at once; the rollout raises it when the call
    ends. ``begin_call()`` forgets it at the start of the next call (the server may be back) and readies what the
    backend needs for a call (a colocated engine that sleeps between calls is woken); ``end_call()`` releases
    that again once the call's generation is over. A backend whose errors are always per request keeps
    ``failure`` ``None``.
    """

    @property
    def name(self) -> str:
        """How logs and rows name this backend ("trainer", "vllm", "vllm-colocate")."""
        ...

    @property
    def max_model_len(self) -> int | None:
        """The most tokens (prompt + completion) one sequence may hold, if the backend has a limit."""
        ...

    @property
    def failure(self) -> GenerationError | None: ...

    async def begin_call(self) -> None:
        """Before a rollout call's first turn."""
        ...

    async def end_call(self) -> None:
        """After a rollout call's last turn, whether its episodes succeeded or not."""
        ...

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, images: PromptImages | None = None
    ) -> Generation:
        """Sample one continuation of exactly ``prompt_ids`` (which, with ``images``, hold their expanded tokens;
        ``images`` is None for a text-only turn)."""
        ...

    async def generate_as(
        self, model: str, prompt_ids: Sequence[int], params: SamplingParams, images: PromptImages | None = None
    ) -> Generation:
        """``generate`` with ``model``, another model the backend serves by name: the async worker's turns go to the
        LoRA adapter of their policy version (``VersionedTurns``). A backend that serves one model only raises
        :func:`named_model_refused`."""
        ...

    async def aclose(self) -> None:
        """Release connections, tasks and threads; the backend is not used afterwards."""
        ...


def named_model_refused(backend: str, model: str) -> ConfigError:
    """The error of a backend that generates with its one model only, asked (``generate_as``) for ``model``."""
    return ConfigError(
        f"The {backend} backend generates with its one model only, not with {model!r} (the LoRA adapter of a policy "
        "version, which the async worker asks for when the trainer syncs adapters). Generate on a vLLM server "
        "that serves the adapters (started with --enable-lora)."
    )


class CallFailure:
    """The first fatal error of a rollout call (a backend's ``failure``): once one turn has failed for good, every
    later turn is refused with it until ``reset()`` at the next call's ``begin_call``.

    ``refusal`` says why a turn is refused, after its label (``"not sent: an earlier request already failed for
    good"``); errors of the ``spared`` types fail their own turn without ending the call.
    """

    def __init__(self, refusal: str, spared: tuple[type[GenerationError], ...] = ()) -> None:
        self._refusal = refusal
        self._spared = spared
        self.error: GenerationError | None = None

    def reset(self) -> None:
        """Forget the error: a new call begins (the server may be back)."""
        self.error = None

    @contextmanager
    def guard(self, label: str) -> Iterator[None]:
        """Around one turn named ``label``: refused at once if the call already failed; its ``GenerationError``, the
        first of the call and not spared, is remembered as the call's failure (and raised on)."""
        if self.error is not None:
            raise GenerationError(f"{label} {self._refusal}: {self.error}")
        try:
            yield
        except GenerationError as exc:
            if self.error is None and not isinstance(exc, self._spared):
                self.error = exc
            raise
