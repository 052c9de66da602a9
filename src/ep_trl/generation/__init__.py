"""Generation backends: what every backend takes and returns, so episodes and the rollout never ask which one runs.

One module per backend, each implementing :class:`Generator`, and the modules that serve them:

* ``trainer`` (backend): in-process, with ``trainer.model``;
* ``vllm`` (backend): a vLLM server; ``vllm_wire``: its request bodies and replies, as pure functions;
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

Those values of one turn (:class:`SamplingParams`, :class:`PromptIds`, :class:`PromptImages`, :class:`Generation`)
are defined in ``ep_trl.trajectory.sampling``, below the backends (the trajectory builder records them without one),
and re-exported here as the backends' interface.
"""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, Sequence

from ..errors import ConfigError, GenerationError
from ..trajectory.sampling import DEFAULT_MAX_TOKENS as DEFAULT_MAX_TOKENS
from ..trajectory.sampling import Generation as Generation
from ..trajectory.sampling import PromptIds as PromptIds
from ..trajectory.sampling import PromptImages as PromptImages
from ..trajectory.sampling import SamplingParams as SamplingParams
from ..trajectory.sampling import ids_json as ids_json

if TYPE_CHECKING:  # named for the checker; the caller builds them
    from trl import GRPOTrainer

    from ..options import VLLMOptions
    from ..trajectory.types import Model, ProcessingClass


@dataclass(frozen=True)
class SyncedServer:
    """A vLLM server the caller keeps on the policy's weights: its URL, and the model id to ask for (None: the
    server's only model)."""

    url: str
    model: str | None = None


@dataclass(frozen=True)
class BackendOffer:
    """What a rollout's caller offers to generate with (the trainer whose colocated engine generates, the server it
    keeps on its weights, its model in this process, an explicit server URL), with the options a backend is built
    with. ``generation.choice`` picks a backend by it and hands it to that backend module's ``build(offer)``."""

    vllm_base_url: str | None
    options: "VLLMOptions"
    max_concurrent_rollouts: int
    colocated_trainer: "GRPOTrainer | None"
    server: SyncedServer | None
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
