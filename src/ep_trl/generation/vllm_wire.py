"""What ep_trl sends a vLLM server and reads back, as pure functions: the ``/v1/completions`` body built from its
encoded parts (the prompt's JSON spliced in, never decoded again), sampling fields, per-request seeds, the
``/inference/v1/generate`` body for a turn with images, and the replies parsed into ``Generation``s.
``ep_trl.generation.vllm`` (the backend) batches and retries the requests; ``colocate`` seeds its engine's requests the
same way."""

import base64
import io
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..errors import GenerationError
from ..trajectory.types import JSONObject
from . import Generation, PromptIds, PromptImages, SamplingParams, ids_json

if TYPE_CHECKING:
    from ..trajectory.types import Image


#: Seeds sent to vLLM stay below 2**63 (its sampling params take a 64-bit signed integer).
_SEED_MODULUS = 2**63 - 1


def json_bytes(body: JSONObject) -> bytes:
    """A request body as compact JSON (what ``aiohttp``'s ``json=`` sends, less the spaces)."""
    return json.dumps(body, separators=(",", ":")).encode()


def prompt_json(prompt_ids: Sequence[int]) -> str:
    """The prompt as a JSON array of ids: the text a ``PromptIds`` already carries, else each id converted and
    encoded."""
    return prompt_ids.json if isinstance(prompt_ids, PromptIds) else ids_json(prompt_ids)


def fields_json(fields: JSONObject) -> str:
    """A request's fields other than the prompt as compact JSON, the body's head for :func:`body_with_prompt`."""
    return json.dumps(fields, separators=(",", ":"))


def body_with_prompt(head: str, prompt: str) -> bytes:
    """The ``/v1/completions`` body: the fields of ``head`` (:func:`fields_json`) and ``"prompt"``, whose value is the
    JSON text ``prompt`` (one array of ids, or an array of them), spliced in without decoding it again."""
    return f'{head[:-1]},"prompt":{prompt}}}'.encode()


def request_seed(base_seed: int | None, request_number: int) -> int | None:
    """A distinct seed per request, derived from ``base_seed`` (None = let vLLM pick).

    vLLM applies a request's ``seed`` to its whole random stream: the episodes of a GRPO group start from the
    same prompt, so sending them one shared seed would make the group's samples identical.
    """
    if base_seed is None:
        return None
    return (int(base_seed) * 1_000_003 + request_number) % _SEED_MODULUS


def completion_payload(
    model: str, prompt_ids: Sequence[int], params: SamplingParams, seed: int | None = None
) -> JSONObject:
    """A ``/v1/completions`` body that samples like TRL's own vLLM path and returns ids and sampled logprobs (sent as
    ``body_with_prompt(fields_json(completion_fields(...)), prompt_json(prompt_ids))``)."""
    return {**completion_fields(model, params, seed), "prompt": [int(t) for t in prompt_ids]}


def completion_fields(model: str, params: SamplingParams, seed: int | None = None) -> JSONObject:
    """:func:`completion_payload` but its prompt, always with the same keys in the same order for equal settings."""
    return {
        "model": model,
        **sampling_fields(params, seed),
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,  # logprob entries keyed by id: no detokenizing them on the server
    }


def sampling_fields(params: SamplingParams, seed: int | None = None) -> JSONObject:
    """vLLM sampling parameters that sample like TRL's own vLLM path, with the sampled token's logprob.

    ``top_k`` 0 (TRL's "off") is sent as vLLM's -1. ``logprobs: 0`` returns exactly the sampled token's
    logprob; with ``--logprobs-mode processed_logprobs`` (what ``trl vllm-serve`` sets) that is the logprob
    under the temperature/top-k/top-p distribution actually sampled from, the quantity TRL recomputes.
    """
    fields: JSONObject = {
        "max_tokens": int(params.max_tokens),
        "temperature": float(params.temperature),
        "top_p": float(params.top_p),
        "top_k": int(params.top_k) if params.top_k > 0 else -1,
        "min_p": float(params.min_p),
        "repetition_penalty": float(params.repetition_penalty),
        "logprobs": 0,
        "skip_special_tokens": False,
    }
    if params.stop:
        fields["stop"] = list(params.stop)
    if params.stop_token_ids:
        fields["stop_token_ids"] = [int(t) for t in params.stop_token_ids]
    if seed is not None:
        fields["seed"] = int(seed)
    return fields


def tokens_payload(model: str, images: PromptImages, params: SamplingParams, seed: int | None = None) -> JSONObject:
    """An ``/inference/v1/generate`` body: the prompt with unexpanded placeholders, its images as PNG data URIs,
    the sampling of :func:`sampling_fields`, and the expanded prompt ids asked back for the check."""
    return {
        "model": model,
        "token_ids": [int(t) for t in images.unexpanded_ids],
        "content_parts": [{"type": "image_url", "url": png_data_uri(image)} for image in images.images],
        "sampling_params": sampling_fields(params, seed),
        "return_token_ids": True,
    }


def png_data_uri(image: "Image") -> str:
    """A PIL image as a ``data:image/png;base64,...`` URI (lossless: vLLM decodes the same pixels)."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def parse_generate_response(data: JSONObject, prompt_ids: Sequence[int], label: str) -> Generation:
    """Sampled ids and logprobs from an ``/inference/v1/generate`` answer, after checking that vLLM expanded the
    image placeholders into exactly the ids the trainer scores."""
    expanded = data.get("prompt_token_ids") if isinstance(data, dict) else None
    if expanded != [int(t) for t in prompt_ids]:
        raise GenerationError(
            f"{label}: vLLM expanded the image placeholders into other prompt ids than the trainer's processing class "
            f"({len(expanded or [])} ids against {len(prompt_ids)}); its image settings (image size, "
            "patching) must match the trainer's, or the sampled logprobs would not be the trainer's."
        )
    choice = batch_choices(data, 1, label)[0]
    ids = choice.get("token_ids")
    content = (choice.get("logprobs") or {}).get("content")
    if ids is None or content is None or len(content) != len(ids):
        raise GenerationError(
            f"{label}: response lacks token_ids or one logprob per sampled token: {str(choice)[:300]}"
        )
    stop_reason = choice.get("stop_reason")
    return Generation(
        tuple(int(t) for t in ids),
        tuple(float(entry["logprob"]) for entry in content),
        str(choice.get("finish_reason") or "stop"),
        stop_reason if isinstance(stop_reason, str) else None,
    )


def batch_choices(data: JSONObject, expected: int, what: str) -> list[JSONObject]:
    """The ``choices`` of a response for ``expected`` prompts (n=1), in prompt order."""
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list) or len(choices) != expected:
        raise GenerationError(f"{what}: expected {expected} choices, got {str(data)[:300]}")
    return sorted(choices, key=lambda c: int(c.get("index", 0)))


def parse_choice(choice: JSONObject, label: str = "vLLM request") -> Generation:
    """Sampled ids and their logprobs (one float each) from one choice of a ``/v1/completions`` response."""
    ids = choice.get("token_ids")
    logprobs = (choice.get("logprobs") or {}).get("token_logprobs")
    if ids is None or logprobs is None:
        raise GenerationError(
            f"{label}: response lacks token_ids or logprobs.token_logprobs; the server must support "
            "return_token_ids (vLLM >= 0.10) and logprobs."
        )
    if len(ids) != len(logprobs):
        raise GenerationError(f"{label}: vLLM returned {len(ids)} token ids but {len(logprobs)} logprobs")
    if any(lp is None for lp in logprobs):
        raise GenerationError(f"{label}: vLLM returned a null logprob for a sampled token: {logprobs}")
    stop_reason = choice.get("stop_reason")
    return Generation(
        tuple(int(t) for t in ids),
        tuple(float(lp) for lp in logprobs),
        str(choice.get("finish_reason") or "stop"),
        stop_reason if isinstance(stop_reason, str) else None,
    )
