"""The one seam to a vLLM server (what ``trl vllm-serve`` runs since TRL 1.11): ``/v1/completions`` with
token-id prompts.

Prompts go out as token ids and sampled ids come back as ids (``return_token_ids``), so nothing is
re-tokenized. Requests from concurrent episodes share one pooled async HTTP client and overlap on the
server, bounded by ``max_in_flight``. Every request has a timeout; transient failures are retried with
backoff a bounded number of times; a 4xx (e.g. a prompt longer than ``max_model_len``) is reported at once.
"""

import asyncio
import logging
import random
from collections.abc import Sequence
from typing import Any

import httpx

from .errors import GenerationError
from .generation import Generation, SamplingParams

logger = logging.getLogger(__name__)

START_HINT = "start it with `trl vllm-serve --model <model>` (or `vllm serve <model>`)"


class VLLMServerGenerator:
    """Generation through a vLLM OpenAI-compatible server."""

    name = "vllm"

    def __init__(
        self,
        base_url: str,
        *,
        model: str | None = None,
        max_in_flight: int = 64,
        request_timeout_s: float = 120.0,
        max_retries: int = 3,
        connect_timeout_s: float = 10.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.max_in_flight = max_in_flight
        self._timeout = httpx.Timeout(request_timeout_s, connect=connect_timeout_s)
        self._max_retries = max_retries
        self._client: httpx.AsyncClient | None = None
        self._semaphore: asyncio.Semaphore | None = None
        self.model = model or self._probe_model(connect_timeout_s)
        self.requests = 0
        self.retries = 0

    def _probe_model(self, timeout_s: float) -> str:
        """Fail at construction, within the connect timeout, when nothing serves at ``base_url``."""
        url = f"{self.base_url}/v1/models"
        try:
            response = httpx.get(url, timeout=timeout_s)
            response.raise_for_status()
            return str(response.json()["data"][0]["id"])
        except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
            raise GenerationError(
                f"No vLLM server answered at {url} ({type(exc).__name__}: {exc}); {START_HINT} and pass its URL."
            ) from exc

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            limits = httpx.Limits(max_connections=self.max_in_flight, max_keepalive_connections=self.max_in_flight)
            self._client = httpx.AsyncClient(base_url=self.base_url, timeout=self._timeout, limits=limits)
            self._semaphore = asyncio.Semaphore(self.max_in_flight)
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Generation:
        payload = completion_payload(self.model, prompt_ids, params)
        data = await self._post("/v1/completions", payload)
        return parse_completion(data)

    async def _post(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        client = self._http()
        assert self._semaphore is not None
        delay = 0.5
        for attempt in range(self._max_retries + 1):
            try:
                async with self._semaphore:
                    self.requests += 1
                    response = await client.post(path, json=payload)
                if response.status_code < 400:
                    return response.json()
                if response.status_code < 500 and response.status_code != 429:
                    raise GenerationError(
                        f"vLLM server {self.base_url}{path} rejected the request with HTTP {response.status_code}: "
                        f"{response.text[:500]} (prompt of {len(payload['prompt'])} tokens, "
                        f"max_tokens={payload['max_tokens']})"
                    )
                problem = f"HTTP {response.status_code}: {response.text[:200]}"
            except (httpx.TimeoutException, httpx.TransportError) as exc:
                problem = f"{type(exc).__name__}: {exc}"
            if attempt == self._max_retries:
                raise GenerationError(
                    f"vLLM request to {self.base_url}{path} failed {attempt + 1} times; last error {problem}. "
                    f"Is the server still up? ({START_HINT})"
                )
            self.retries += 1
            logger.warning("vLLM request failed (%s); retry %d/%d in %.1f s", problem, attempt + 1,
                           self._max_retries, delay)
            await asyncio.sleep(delay * (1 + random.random() * 0.25))
            delay *= 2
        raise AssertionError("unreachable")


def completion_payload(model: str, prompt_ids: Sequence[int], params: SamplingParams) -> dict[str, Any]:
    """A ``/v1/completions`` body that samples like TRL's own vLLM path and returns ids and sampled logprobs."""
    payload: dict[str, Any] = {
        "model": model,
        "prompt": list(prompt_ids),
        "max_tokens": params.max_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k if params.top_k > 0 else -1,
        "min_p": params.min_p,
        "repetition_penalty": params.repetition_penalty,
        "logprobs": 0,
        "return_token_ids": True,
        "skip_special_tokens": False,
    }
    if params.stop:
        payload["stop"] = list(params.stop)
    if params.stop_token_ids:
        payload["stop_token_ids"] = list(params.stop_token_ids)
    if params.seed is not None:
        payload["seed"] = params.seed
    return payload


def parse_completion(data: dict[str, Any]) -> Generation:
    """Sampled ids and their logprobs from a ``/v1/completions`` response; a clear error if either is missing."""
    try:
        choice = data["choices"][0]
    except (KeyError, IndexError, TypeError) as exc:
        raise GenerationError(f"vLLM response has no choices: {str(data)[:300]}") from exc
    ids = choice.get("token_ids")
    logprobs = (choice.get("logprobs") or {}).get("token_logprobs")
    if ids is None or logprobs is None:
        raise GenerationError(
            "vLLM response lacks token_ids or logprobs.token_logprobs; the server must support "
            "return_token_ids (vLLM >= 0.10) and logprobs."
        )
    if len(ids) != len(logprobs):
        raise GenerationError(f"vLLM returned {len(ids)} token ids but {len(logprobs)} logprobs")
    stop_reason = choice.get("stop_reason")
    return Generation(
        tuple(int(t) for t in ids),
        tuple(float(lp) for lp in logprobs),
        str(choice.get("finish_reason") or "stop"),
        stop_reason if isinstance(stop_reason, str) else None,
    )
