"""In-process generation with the model being trained: the CPU default, always on-policy.

Concurrent episodes each ask for one turn at a time. Requests that arrive while the model is busy are
batched into one left-padded ``generate`` call, so episodes still overlap on a single model. Each row is cut
at its own end (EOS, stop token, stop string or its own ``max_tokens``); cutting a causal sample early is
itself a valid sample, so rows of a batch need not share a length.

A turn with images (a vision-language model's screenshots) is sampled with the images' pixel inputs, built from the
prompt ids as the TRL seam builds them for the loss (``ep_trl.trajectory.vision_inputs``); rows of a batch may hold
different numbers of images, or none.
"""

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, cast

from ..errors import ConfigError
from ..trajectory.content import supports_images, tokenizer_of
from ..trajectory.tokens import eos_token_ids
from ..trajectory.vision_inputs import vision_inputs
from . import BackendOffer, Generation, PromptImages, SamplingParams, named_model_refused
from .batching import BatchQueue

if TYPE_CHECKING:
    import torch

    from ..trajectory.types import Model, ProcessingClass, Tokenizer

logger = logging.getLogger(__name__)


@dataclass
class _Request:
    prompt_ids: tuple[int, ...]
    params: SamplingParams
    images: PromptImages | None = None


class _Sampled(Protocol):
    """What ``model.generate(..., return_dict_in_generate=True, output_logits=True)`` returns, as read here."""

    sequences: "torch.Tensor"
    logits: "tuple[torch.Tensor, ...]"


class TrainerGenerator:
    """Samples from ``model_provider()`` in a dedicated thread, batching concurrent requests. ``processing_class`` is
    the trainer's multimodal processing class (None for a text model), needed to turn a turn's images into pixel
    inputs."""

    name = "trainer"

    def __init__(
        self,
        model_provider: "Callable[[], Model]",
        tokenizer: "Tokenizer",
        eos_token_ids: Sequence[int],
        pad_token_id: int,
        max_batch_size: int = 16,
        processing_class: "ProcessingClass | None" = None,
    ) -> None:
        if not eos_token_ids:
            raise ValueError("the tokenizer/model defines no EOS token; multi-turn episodes need one to end a turn")
        self._model_provider = model_provider
        self._tokenizer = tokenizer
        self._eos = tuple(int(t) for t in eos_token_ids)
        self._pad = int(pad_token_id)
        self._processing_class = processing_class
        self._batches: BatchQueue[_Request, Generation] = BatchQueue(
            self._generate_batch,
            max_batch_size=max_batch_size,
            batch_key=_sampling_key,
            thread_name="ep-trl-generate",
            task_name="ep-trl-trainer-generation",
        )
        self.batches = 0
        self.requests = 0

    @property
    def max_model_len(self) -> int | None:
        """The model's ``max_model_len`` (``config.max_position_embeddings``), read from the current model."""
        value = getattr(getattr(self._model_provider(), "config", None), "max_position_embeddings", None)
        return int(value) if value else None

    @property
    def failure(self) -> None:
        """Always None: a failed ``generate`` is handed to the episodes that asked, and the next batch runs anew."""
        return None

    async def begin_call(self) -> None:
        """Nothing to forget or ready (see ``failure``)."""

    async def end_call(self) -> None:
        """Nothing to release."""

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, images: PromptImages | None = None
    ) -> Generation:
        if params.temperature < 0:
            raise ValueError(
                "the trainer backend samples at the GRPOConfig temperature, which must be > 0 (0: greedy "
                "decoding, as held-out episodes are played)"
            )
        if images is not None and self._processing_class is None:
            raise ValueError("a turn with images reached the trainer backend of a text-only processing class")
        return await self._batches.submit(_Request(tuple(prompt_ids), params, images))

    async def aclose(self) -> None:
        await self._batches.aclose()

    async def generate_as(
        self, model: str, prompt_ids: Sequence[int], params: SamplingParams, images: PromptImages | None = None
    ) -> Generation:
        """Refused: this backend generates with the trainer's model only."""
        raise named_model_refused(self.name, model)

    def _generate_batch(self, requests: list[_Request]) -> list[Generation]:
        import torch
        from transformers import GenerationConfig

        model = self._model_provider()
        params = requests[0].params
        width = max(len(r.prompt_ids) for r in requests)
        input_ids = torch.tensor([(self._pad,) * (width - len(r.prompt_ids)) + r.prompt_ids for r in requests])
        attention = torch.tensor([[0] * (width - len(r.prompt_ids)) + [1] * len(r.prompt_ids) for r in requests])
        device = next(model.parameters()).device
        vision = (
            vision_inputs(self._processing_class, input_ids, [r.images.images if r.images else () for r in requests])
            if any(r.images for r in requests)
            else None
        )
        pixels = {k: v.to(device) for k, v in vision.model_kwargs.items()} if vision else {}
        stop_ids = tuple(dict.fromkeys(self._eos + params.stop_token_ids))
        greedy = params.temperature == 0  # held-out play: the most likely token, log-probabilities at temperature 1
        sampling = (
            {}
            if greedy
            else dict(
                temperature=params.temperature,
                top_p=params.top_p,
                top_k=params.top_k if params.top_k > 0 else 0,
                min_p=params.min_p if params.min_p > 0 else None,
            )
        )
        config = GenerationConfig(
            do_sample=not greedy,
            **sampling,
            repetition_penalty=params.repetition_penalty,
            max_new_tokens=max(r.params.max_tokens for r in requests),
            eos_token_id=list(stop_ids),
            pad_token_id=self._pad,
            output_logits=True,
            return_dict_in_generate=True,
        )
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                generate = cast("Callable[..., _Sampled]", model.generate)  # a generative model's GenerationMixin
                out = generate(
                    input_ids=input_ids.to(device),
                    attention_mask=attention.to(device),
                    generation_config=config,
                    **pixels,
                )
                sampled = out.sequences[:, width:]
                logits = torch.stack(out.logits, dim=1).float() / (params.temperature or 1.0)
                logps = torch.log_softmax(logits, dim=-1).gather(-1, sampled.unsqueeze(-1)).squeeze(-1)
        finally:
            model.train(was_training)
        self.batches += 1
        self.requests += len(requests)
        return [self._cut(sampled[i].tolist(), logps[i].tolist(), r.params, stop_ids) for i, r in enumerate(requests)]

    def _cut(self, ids: list[int], logps: list[float], params: SamplingParams, stop_ids: tuple[int, ...]) -> Generation:
        end, reason = min(len(ids), params.max_tokens), "length"
        for i, tok in enumerate(ids[:end]):
            if tok in stop_ids:
                end, reason = i + 1, "stop"
                break
        stop_text = None
        if params.stop:
            hit = _first_stop_string(self._tokenizer, ids[:end], params.stop)
            if hit is not None:
                end, stop_text, reason = hit[0], hit[1], "stop"
        return Generation(tuple(ids[:end]), tuple(logps[:end]), reason, stop_text)


def _sampling_key(request: _Request) -> tuple:
    """Rows of one ``generate`` call must share the sampling distribution (max_tokens and stops may differ)."""
    p = request.params
    return p.temperature, p.top_p, p.top_k, p.min_p, p.repetition_penalty, p.stop_token_ids


def _first_stop_string(tokenizer: "Tokenizer", ids: list[int], stops: tuple[str, ...]) -> tuple[int, str] | None:
    """The shortest prefix of ``ids`` whose text contains a stop string, and that string."""
    if not any(s in tokenizer.decode(ids, skip_special_tokens=True) for s in stops):
        return None
    for k in range(1, len(ids) + 1):
        text = tokenizer.decode(ids[:k], skip_special_tokens=True)
        for s in stops:
            if s in text:
                return k, s
    return None


def build(offer: BackendOffer) -> TrainerGenerator:
    """The backend on the caller's model in this process (``offer.model_provider``)."""
    provider, processing_class = offer.model_provider, offer.processing_class
    if provider is None:
        raise ConfigError(
            "backend='trainer' samples with the trainer's model in this process, and this caller has "
            "none in reach; generate on a vLLM server (vllm_base_url=...)."
        )
    tokenizer = tokenizer_of(processing_class)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return TrainerGenerator(
        provider,
        tokenizer,
        eos_token_ids(processing_class, provider()),
        pad,
        processing_class=processing_class if supports_images(processing_class) else None,
    )
