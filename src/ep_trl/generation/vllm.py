"""The one seam to a vLLM server (what ``trl vllm-serve`` runs since TRL 1.11): ``/v1/completions`` with
token-id prompts, and ``/inference/v1/generate`` for token-id prompts with images.

Prompts go out as token ids and sampled ids come back as ids (``return_token_ids``), so nothing is
re-tokenized; each sampled token's logprob comes back as one float (``logprobs: 0``). Turns of concurrent
episodes are in flight together (at most ``max_in_flight`` at a time when it is set), over one pooled aiohttp
session; turns that arrive within a few milliseconds of each other share one request (a list of prompts).
Failure handling, so that training never hangs:

* construction probes ``GET /v1/models`` (model id and ``max_model_len``) and fails within
  ``connect_timeout_s`` when nothing answers, naming the URL and the command that starts a server;
* every request has a total timeout; timeouts, dropped connections, HTTP 5xx and 429 are retried
  ``max_retries`` times with exponential backoff, then fail with an error naming the request;
* any other HTTP 4xx (a prompt over ``max_model_len``, a token outside the vocabulary) fails at once (a
  rejected batch is re-sent one prompt at a time, so only the offending turn fails);
* after one request has failed for good, the generator is ``failure``-marked and later requests fail
  immediately, so a dead server ends the rollout call in bounded time instead of every episode
  retrying in turn.

Images (a vision-language model's screenshots). ``/v1/completions`` takes no images; vLLM's token-in/token-out
route ``POST /inference/v1/generate`` (vLLM >= 0.32, served with ``--enable-scale-out``) takes ``token_ids`` with
``content_parts`` (images as data URIs). vLLM expands each image placeholder itself, so a turn with images sends the
prompt with its placeholders unexpanded (``PromptImages.unexpanded_ids``) and checks that the prompt ids vLLM
reports back (``return_token_ids``) equal the expanded ids the trainer scores; a mismatch fails the turn, naming
both. These turns go out one per request, with the same retries and failure marking.
"""

import asyncio
import contextlib
import itertools
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import aiohttp

from ..errors import ConfigError, GenerationError
from ..options import VLLMOptions
from ..trajectory.types import JSONObject
from . import BackendOffer, CallFailure, Generation, PromptImages, SamplingParams
from .probe import RETRYABLE_STATUS, START_HINT, RetryPolicy, error_message, probe_server
from .vllm_wire import (
    batch_choices,
    body_with_prompt,
    completion_fields,
    fields_json,
    json_bytes,
    parse_choice,
    parse_generate_response,
    prompt_json,
    request_seed,
    tokens_payload,
)

if TYPE_CHECKING:
    pass

logger = logging.getLogger(__name__)

#: vLLM's token-in/token-out route, the one that takes token ids with images.
GENERATE_PATH = "/inference/v1/generate"


#: Request fields (and their JSON) kept per model and sampling settings; cleared when this many are kept.
_FIELDS_CACHE_SIZE = 256


class RejectedRequest(GenerationError):
    """The server answered with a 4xx other than 429: sending the same request again cannot help."""


@dataclass
class _Member:
    """One episode turn waiting in a batch: its prompt as JSON text (``prompt_json``) and its length in ids."""

    prompt: str
    tokens: int
    label: str
    future: asyncio.Future = field(init=False)


@dataclass
class _Batch:
    """Turns with identical sampling fields (``head``: their JSON, see :func:`body_with_prompt`), sent as one request
    carrying a list of prompts."""

    number: int
    fields: JSONObject
    head: str
    members: list[_Member] = field(default_factory=list)


class VLLMServerGenerator:
    """Generation through a vLLM OpenAI-compatible server; safe to call from many episodes at once.

    Turns that arrive within ``batch_window_s`` of each other with the same sampling settings go out as one
    ``/v1/completions`` request with a list of prompts (vLLM answers one choice per prompt, in order): on a
    loaded server, per-request overhead dominates short turns (8 separate 12-token requests took ~2x as long
    as one request carrying all 8, docs/vllm-cpu.md). ``batch_window_s=0`` sends every turn on its own. Turns
    are always sent alone when ``VLLMOptions.seed`` is set (a seed applies to a whole request).
    """

    name = "vllm"

    def __init__(
        self, base_url: str, options: VLLMOptions, *, model: str | None = None, max_model_len: int | None = None
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._url = f"{self.base_url}/v1/completions"
        self._generate_url = f"{self.base_url}{GENERATE_PATH}"
        #: Most episode turns (prompts) in flight at once, batched or not; None: as many as episodes in flight.
        self.max_in_flight = options.max_in_flight
        self.request_timeout_s = options.request_timeout_s
        self.batch_window_s = options.batch_window_s
        self.seed = options.seed
        self.retry = RetryPolicy(max_retries=options.max_retries, backoff_s=options.retry_backoff_s)
        self._timeout = aiohttp.ClientTimeout(total=options.request_timeout_s, sock_connect=options.connect_timeout_s)
        self._client: aiohttp.ClientSession | None = None
        self._slots: asyncio.Semaphore | contextlib.nullcontext[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._open: dict[str, _Batch] = {}
        self._fields: dict[tuple[str, SamplingParams], tuple[JSONObject, str]] = {}
        self._tasks: set[asyncio.Task] = set()
        info = probe_server(self.base_url, options.connect_timeout_s)
        self.model = model or info.model
        self._max_model_len = max_model_len or info.max_model_len
        self._turns = itertools.count(1)
        self._http_numbers = itertools.count(1)
        self._failure = CallFailure("not sent: an earlier request already failed for good")
        self.requests = 0  # HTTP requests sent, retries included
        self.retries = 0
        self.turns = 0

    @property
    def max_model_len(self) -> int | None:
        """Read from the server; episodes clip each turn's ``max_tokens`` so prompt + completion fit it."""
        return self._max_model_len

    @property
    def failure(self) -> GenerationError | None:
        """The error that ended a turn for good; later turns fail at once until ``begin_call()``."""
        return self._failure.error

    async def begin_call(self) -> None:
        """Forget an earlier fatal failure (the server may be back)."""
        self._failure.reset()

    async def end_call(self) -> None:
        """Nothing to release: the server's memory is its own."""

    def _bind(self) -> tuple[aiohttp.ClientSession, asyncio.Semaphore | contextlib.nullcontext[None]]:
        """The pooled session and the in-flight budget (none when ``max_in_flight`` is None: the connector's
        connections unlimited too), bound to the running loop (rebuilt if the loop changed).

        aiohttp rather than httpx for the hot path: on this project's 2-core machine an async request cost
        ~1 ms of client CPU with aiohttp against ~2.5 ms with httpx (docs/benchmarks.md); the one-off
        synchronous probe stays on httpx."""
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            connector = aiohttp.TCPConnector(limit=self.max_in_flight or 0)  # 0: aiohttp's "no limit"
            self._client = aiohttp.ClientSession(timeout=self._timeout, connector=connector)
            self._slots = (
                contextlib.nullcontext() if self.max_in_flight is None else asyncio.Semaphore(self.max_in_flight)
            )
            self._loop = loop
            self._open = {}
        assert self._slots is not None
        return self._client, self._slots

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._client is not None:
            # a session made on another loop can only be closed there; that loop (an ended asyncio.run) is gone
            if self._loop is asyncio.get_running_loop():
                await self._client.close()
            self._client = None

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, images: PromptImages | None = None
    ) -> Generation:
        return await self.generate_as(self.model, prompt_ids, params, images)

    async def generate_as(
        self, model: str, prompt_ids: Sequence[int], params: SamplingParams, images: PromptImages | None = None
    ) -> Generation:
        """``generate`` with another model the server serves (a LoRA adapter loaded under that name); turns for
        different models never share a request."""
        if images is not None:
            return await self._generate_with_images(model, prompt_ids, params, images)
        number = next(self._turns)
        fields, head = self.request_fields(model, params, request_seed(self.seed, number))
        label = (
            f"turn request #{number} to {self.base_url}/v1/completions (prompt of {len(prompt_ids)} "
            f"tokens, max_tokens={fields['max_tokens']})"
        )
        with self._failure.guard(label):
            _, slots = self._bind()
            async with slots:
                self.turns += 1
                prompt = prompt_json(prompt_ids)
                if self.batch_window_s == 0 or "seed" in fields:
                    choice = await self._send_one(prompt, head, label)
                else:
                    choice = await self._join_batch(_Member(prompt, len(prompt_ids), label), fields, head)
            return parse_choice(choice, label)  # an answer without token ids fails for good too

    def request_fields(self, model: str, params: SamplingParams, seed: int | None) -> tuple[JSONObject, str]:
        """``completion_fields`` and their JSON (``fields_json``); built once per model and settings when unseeded
        (shared: read, never changed)."""
        if seed is not None:
            fields = completion_fields(model, params, seed)
            return fields, fields_json(fields)
        kept = self._fields.get((model, params))
        if kept is None:
            if len(self._fields) >= _FIELDS_CACHE_SIZE:
                self._fields.clear()
            fields = completion_fields(model, params)
            kept = self._fields[(model, params)] = (fields, fields_json(fields))
        return kept

    async def _generate_with_images(
        self, model: str, prompt_ids: Sequence[int], params: SamplingParams, images: PromptImages
    ) -> Generation:
        number = next(self._turns)
        body = tokens_payload(model, images, params, seed=request_seed(self.seed, number))
        label = (
            f"turn request #{number} to {self._generate_url} (prompt of {len(prompt_ids)} tokens with "
            f"{len(images.images)} image(s), max_tokens={params.max_tokens}; token ids with images need a vLLM "
            "server started with --enable-scale-out)"
        )
        with self._failure.guard(label):
            _, slots = self._bind()
            async with slots:
                self.turns += 1
                data = await self._post(json_bytes(body), label, self._generate_url)
            return parse_generate_response(data, prompt_ids, label)

    async def _join_batch(self, member: _Member, fields: JSONObject, head: str) -> JSONObject:
        # equal fields, built in one order by completion_fields, have equal JSON: the batch's key is its head
        batch = self._open.get(head)
        loop = asyncio.get_running_loop()
        if batch is None:
            batch = _Batch(next(self._http_numbers), fields, head)
            self._open[head] = batch
            loop.call_later(self.batch_window_s, self._dispatch, head, batch)
        member.future = loop.create_future()
        batch.members.append(member)
        return await member.future

    def _dispatch(self, key: str, batch: _Batch) -> None:
        if self._open.get(key) is batch:
            del self._open[key]
        task = asyncio.get_running_loop().create_task(self._run_batch(batch))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_batch(self, batch: _Batch) -> None:
        members = [m for m in batch.members if not m.future.done()]
        if not members:
            return
        if len(members) == 1:
            await self._resend_alone(members[0], batch.head)
            return
        what = (
            f"batch request #{batch.number} to {self.base_url}/v1/completions ({len(members)} prompts of "
            f"{min(m.tokens for m in members)}-{max(m.tokens for m in members)} tokens, "
            f"max_tokens={batch.fields['max_tokens']})"
        )
        try:
            data = await self._post(body_with_prompt(batch.head, f"[{','.join(m.prompt for m in members)}]"), what)
            choices = batch_choices(data, len(members), what)
        except RejectedRequest as exc:
            # one prompt spoils the whole batch: send each alone, so only the offending turn fails, naming itself
            logger.warning("%s was rejected (%s); sending its %d prompts one by one", what, exc, len(members))
            await asyncio.gather(*(self._resend_alone(m, batch.head) for m in members))
            return
        except GenerationError as exc:
            for m in members:
                _settle(m, error=GenerationError(f"{m.label}, sent in {exc}"))
            return
        except BaseException as exc:  # cancellation or a bug: the waiting turns must not hang
            for m in members:
                _settle(m, error=GenerationError(f"{m.label}: {what} ended with {type(exc).__name__}: {exc}"))
            raise
        for m, choice in zip(members, choices):
            _settle(m, result=choice)

    async def _resend_alone(self, member: _Member, head: str) -> None:
        try:
            _settle(member, result=await self._send_one(member.prompt, head, member.label))
        except GenerationError as exc:
            _settle(member, error=exc)

    async def _send_one(self, prompt: str, head: str, label: str) -> JSONObject:
        data = await self._post(body_with_prompt(head, prompt), label)
        return batch_choices(data, 1, label)[0]

    async def _post(self, body: bytes, what: str, url: str | None = None) -> JSONObject:
        """POST ``body`` (JSON) to ``url`` (default ``/v1/completions``) with the retry policy; ``what`` names the
        request in errors and logs."""
        client, _ = self._bind()
        attempts = self.retry.max_retries + 1
        for attempt in range(1, attempts + 1):
            self.requests += 1
            try:
                # bound the whole exchange, reading the body included, not just each socket operation (in this
                # task: asyncio.timeout, not wait_for, which runs the exchange as one more task)
                async with asyncio.timeout(self.request_timeout_s):
                    status, text = await _exchange(client, url or self._url, body)
            except TimeoutError as exc:
                problem = f"no answer within {self.request_timeout_s:g} s ({type(exc).__name__})"
            except aiohttp.ClientError as exc:  # refused or dropped connections, truncated bodies
                problem = f"{type(exc).__name__}: {exc}"
            else:
                if status < 400:
                    try:
                        return json.loads(text)
                    except ValueError as exc:
                        raise GenerationError(
                            f"{what}: the server answered {status} with a body that is not JSON: {text[:300]!r}"
                        ) from exc
                if status not in RETRYABLE_STATUS:
                    raise RejectedRequest(
                        f"{what} was rejected with HTTP {status}: {error_message(text)}. "
                        "Not retried: the same request would be rejected again."
                    )
                problem = f"HTTP {status}: {error_message(text)}"
            if attempt == attempts:
                raise GenerationError(
                    f"{what} failed {attempts} times (timeout {self.request_timeout_s:g} s each); last error: "
                    f"{problem}. Is the vLLM server still up? If not, {START_HINT}."
                )
            delay = self.retry.delay(attempt)
            self.retries += 1
            logger.warning(
                "%s failed (%s); retry %d/%d in %.1f s", what, problem, attempt, self.retry.max_retries, delay
            )
            await asyncio.sleep(delay)
        raise AssertionError("unreachable")


_JSON_HEADERS = {"Content-Type": "application/json"}


async def _exchange(client: aiohttp.ClientSession, url: str, body: bytes) -> tuple[int, str]:
    """POST one completion request (its JSON body already encoded); its status and body text."""
    async with client.post(url, data=body, headers=_JSON_HEADERS) as response:
        return response.status, await response.text()


def _settle(member: _Member, result: JSONObject | None = None, error: BaseException | None = None) -> None:
    """Hand a batch's answer (or error) to one waiting turn, unless that turn was cancelled meanwhile."""
    if member.future.done():
        return
    if error is not None:
        member.future.set_exception(error)
    else:
        member.future.set_result(result)


#: Logged when ep_trl generates on a server that no trainer keeps on its weights (an explicit ``vllm_base_url``).
OFF_POLICY_WARNING = (
    "Generating with the vLLM server at %s, which this trainer does not push weights to: rollouts are off-policy "
    "after the first optimizer step (and TRL applies no importance-sampling correction with use_vllm=False). Keep "
    "the server in sync with GRPOConfig(use_vllm=True, vllm_mode='server') on GPUs, or "
    "ep_trl.trainers.disk_sync.DiskSyncGRPOTrainer on CPU; on one GPU, vllm_mode='colocate' (docs/vllm.md)."
)


def build(offer: BackendOffer) -> VLLMServerGenerator:
    """The backend on the server the caller keeps on its weights (``offer.server``), else on ``vllm_base_url``."""
    server, explicit = offer.server, offer.vllm_base_url
    url = server.url if server is not None else explicit
    if url is None:
        raise ConfigError(
            "backend='vllm' needs a server: train with GRPOConfig(use_vllm=True, vllm_mode='server') "
            "or pass vllm_base_url='http://HOST:PORT'."
        )
    if server is not None and explicit and explicit != server.url:
        logger.warning(
            "vllm_base_url=%s is ignored: the trainer generates with use_vllm=True and pushes its weights "
            "to %s, so ep_trl generates there too.",
            explicit,
            server.url,
        )
    if server is None:
        logger.warning(OFF_POLICY_WARNING, url)
    return VLLMServerGenerator(url, offer.options, model=server.model if server is not None else None)
