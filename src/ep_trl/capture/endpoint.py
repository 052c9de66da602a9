"""The OpenAI-compatible endpoint the eval's processor calls during training, served on 127.0.0.1 by ep_trl.

``POST /v1/chat/completions`` (tools included, no streaming) and ``GET /v1/models``. The request's ``model`` names
the rollout: ``ep-trl/<token>``, the model alias ep_trl gives each row before handing it to the processor (through
LiteLLM's ``hosted_vllm/`` provider that is ``hosted_vllm/ep-trl/<token>``). Each call is answered by that rollout's
``RolloutCapture``, which generates with the configured backend and records the tokens.

Who can reach a rollout: only the processor ep_trl handed its row to. Training nodes are shared machines, so every
local process can connect to 127.0.0.1:

* each rollout call has a fresh key (:meth:`CaptureEndpoint.new_call`), 256 random bits, which ep_trl puts in the
  completion params it hands the processor (``api_key``) and in ``HOSTED_VLLM_API_KEY`` (LiteLLM's ``hosted_vllm``
  provider sends either as ``Authorization: Bearer``); a request without it is answered 401 and changes nothing;
* rollout tokens are 128 random bits, unrelated to the rollout ids ``ep logs`` shows, and ``GET /v1/models`` lists
  none of them;
* only ``application/json`` bodies holding a JSON object are read (a web page cannot post one without a CORS
  preflight, which this endpoint does not answer); a request malformed in any field it sets is answered 400 before
  it reaches the rollout it names;
* a model name that is no rollout is remembered for the current call only, bounded in number and length, and only
  when the request carried the key (so only the eval's own processor can make it fail a call).

A call that ep_trl cannot serve as configured (a ``ConfigError`` or ``UnsupportedEvalError`` raised while serving it,
e.g. tools offered to a model whose chat template has no tool-call format) is answered 400, its message in the
OpenAI error body: the OpenAI client retries 5xx answers and not 4xx, and the same call would fail the same way
again. The capture keeps the error and the rollout raises it once the processor returns. (LiteLLM's own
``num_retries``, which eval-protocol's MCP-gym policy sets to 8, retries any error when ``tenacity`` is installed,
4xx included; ``ep-trl train`` refuses the usual cause, tools without a tool-call format, before anything starts.)

Why not a proxy that exists: openenv 0.10's capture proxy forwards to an HTTP engine that renders and parses
(so not to the in-process trainer backend), tells rollouts apart by API key (AgentRolloutProcessor sends none of
its own), and is not part of openenv-core 0.3; eval-protocol's token-in client speaks Fireworks' API only.
docs/processors.md has the details.
"""

from __future__ import annotations

import hmac
import logging
import secrets
import socket
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from ..errors import ConfigError, UnsupportedEvalError
from ..trajectory.episode import EpisodeFailure
from ..trajectory.types import JSONObject
from .placement import RolloutCapture, TurnRequest

if TYPE_CHECKING:  # aiohttp is imported when the endpoint starts, not with ep_trl
    from aiohttp import web

logger = logging.getLogger(__name__)

#: The model name a captured rollout's requests carry: ``ep-trl/<token>``.
MODEL_PREFIX = "ep-trl/"

#: Request fields ep_trl cannot honour; a request that sets them is refused rather than answered differently.
_REFUSED = {
    "stream": "streaming is not served; ep_trl removes stream=True from the eval's completion_params",
    "n": "one choice per call (n=1) is served: each sample of a prompt group is its own rollout",
    "response_format": "constrained decoding (response_format) is not served",
    "guided_json": "constrained decoding is not served",
    "guided_regex": "constrained decoding is not served",
    "guided_choice": "constrained decoding is not served",
}


#: Model names that are no rollout, remembered per call: at most this many, each cut to this length.
MAX_UNKNOWN_MODELS = 8
MAX_NAME_CHARS = 200

_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
#: Fields the endpoint does not use (sampling comes from the GRPOConfig) but still checks, and their types.
_CHECKED = {
    "temperature": (int, float),
    "top_p": (int, float),
    "frequency_penalty": (int, float),
    "presence_penalty": (int, float),
    "seed": (int,),
    "user": (str,),
    "logprobs": (bool,),
    "top_logprobs": (int,),
    "parallel_tool_calls": (bool,),
    "tool_choice": (str, Mapping),
}


class BadRequest(ValueError):
    """A request that is malformed in one of its fields (answered 400)."""


def new_token() -> str:
    """A rollout's token in its model name: 128 random bits."""
    return secrets.token_hex(16)


class CaptureEndpoint:
    """Serves the captured rollouts' model calls; started and stopped on the rollout function's event loop."""

    def __init__(self, serve_any: Callable[[str], RolloutCapture] | None = None) -> None:
        """``serve_any``: for a model name that is no captured rollout, a fresh capture that answers that one call,
        with no key required (``ep-trl serve``, a local model server like vLLM's); without it such a call is
        refused and every request needs the call's key."""
        self._serve_any = serve_any
        self._captures: dict[str, RolloutCapture] = {}
        self._key: str | None = None
        #: Model names of this call that are no rollout, sent with the key: the processor ignores the row's model.
        self.unknown_models: list[str] = []
        self._runner: web.AppRunner | None = None
        self.base_url: str | None = None

    @property
    def running(self) -> bool:
        return self._runner is not None

    def new_call(self) -> str:
        """Start a rollout call: a new key (the last call's stops working) and no unknown model names yet."""
        self._key = secrets.token_urlsafe(32)
        self.unknown_models = []
        return self._key

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        from aiohttp import web

        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind((host, port))
        await web.SockSite(runner, sock).start()
        self._runner = runner
        self.base_url = f"http://{host}:{sock.getsockname()[1]}/v1"
        logger.info("ep_trl: the eval's processor calls the model at %s", self.base_url)

    def add(self, capture: RolloutCapture) -> None:
        self._captures[capture.token] = capture

    def remove(self, token: str) -> None:
        self._captures.pop(token, None)

    async def aclose(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def _authorized(self, request: web.Request) -> bool:
        if self._serve_any is not None:
            return True
        sent = request.headers.get("Authorization", "")
        return self._key is not None and hmac.compare_digest(sent.encode(), f"Bearer {self._key}".encode())

    async def _models(self, request: web.Request) -> web.Response:
        from aiohttp import web

        if not self._authorized(request):
            return _error(401, "send the key ep_trl gave the processor (Authorization: Bearer <api_key>)")
        return web.json_response(
            {
                "object": "list",
                "data": [  # rollouts are never listed
                    {"id": MODEL_PREFIX.rstrip("/"), "object": "model", "owned_by": "ep_trl"}
                ],
            }
        )

    async def _chat(self, request: web.Request) -> web.Response:
        from aiohttp import web

        if request.content_type != "application/json":
            return _error(415, f"the body must be application/json, not {request.content_type!r}")
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "the request body is not JSON")
        if not isinstance(body, dict):
            return _error(400, f"the request body must be a JSON object, not {type(body).__name__}")
        model = body.get("model")
        if not isinstance(model, str):
            return _error(400, "model must be a string")
        name = model.split("/", 1)[1] if model.startswith("hosted_vllm/") else model  # as plain OpenAI clients send it
        capture = self._captures.get(name[len(MODEL_PREFIX) :]) if name.startswith(MODEL_PREFIX) else None
        if not self._authorized(request):
            if capture is not None:
                capture.unauthorized += 1  # its name was known, its key was not: the processor drops api_key
            return _error(
                401,
                "send the key ep_trl gave the processor: completion_params['api_key'] (LiteLLM sends "
                "it, or HOSTED_VLLM_API_KEY, as Authorization: Bearer)",
            )
        if capture is None and self._serve_any is not None:
            capture = self._serve_any(model)
        if capture is None:
            if len(self.unknown_models) < MAX_UNKNOWN_MODELS:
                self.unknown_models.append(model[:MAX_NAME_CHARS])
            return _error(
                404,
                f"model {model[:MAX_NAME_CHARS]!r} is not a rollout ep_trl is capturing: ep_trl gives "
                f"each row the model 'hosted_vllm/{MODEL_PREFIX}<token>' in its completion_params; the "
                "processor must call the model the row names",
            )
        refused = [reason for key, reason in _REFUSED.items() if _asks(body, key)]
        if refused:
            return _error(400, "; ".join(refused))
        try:
            turn = turn_request(body)
        except BadRequest as exc:
            return _error(400, str(exc))
        try:
            reply = await capture.turn(turn)
        except EpisodeFailure as exc:
            return _error(502, f"generation failed: {exc}")
        except (ConfigError, UnsupportedEvalError) as exc:  # the same answer on every try: retrying cannot help
            return _error(400, f"ep_trl cannot serve this eval as configured: {exc}", kind="invalid_request_error")
        except Exception as exc:  # kept by the capture and raised by the rollout once the processor returns
            return _error(500, f"ep_trl could not serve this call: {type(exc).__name__}: {exc}")
        return web.json_response(
            {
                "id": f"chatcmpl-{capture.calls}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": model,
                "choices": [{"index": 0, "message": reply.message, "finish_reason": reply.finish_reason}],
                "usage": {
                    "prompt_tokens": reply.prompt_tokens,
                    "completion_tokens": len(reply.completion_ids),
                    "total_tokens": reply.prompt_tokens + len(reply.completion_ids),
                },
            }
        )


def turn_request(body: JSONObject) -> TurnRequest:
    """The call as a ``TurnRequest``; ``BadRequest`` naming the first field that is malformed."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list of message objects")
    for k, message in enumerate(messages):
        _check_message(k, message)
    tools = body.get("tools")
    if tools is not None and (not isinstance(tools, list) or not all(_is_tool(t) for t in tools)):
        raise BadRequest("tools must be a list of {'type': 'function', 'function': {'name': ...}} objects")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        raise BadRequest(f"max_tokens must be an integer >= 1, not {max_tokens!r}"[:200])
    stop = body.get("stop")
    stops = (stop,) if isinstance(stop, str) else stop
    if stops is not None and (not isinstance(stops, list | tuple) or not all(isinstance(s, str) and s for s in stops)):
        raise BadRequest("stop must be a string or a list of non-empty strings")
    for key, types in _CHECKED.items():
        value = body.get(key)
        if value is not None and (not isinstance(value, types) or (isinstance(value, bool) and bool not in types)):
            raise BadRequest(f"{key} has the wrong type ({type(value).__name__})")
    return TurnRequest(
        messages=tuple(messages), tools=tuple(tools) if tools else None, max_tokens=max_tokens, stop=tuple(stops or ())
    )


def _check_message(k: int, message: object) -> None:
    if not isinstance(message, Mapping) or message.get("role") not in _ROLES:
        raise BadRequest(f"messages[{k}] must be an object whose role is one of {sorted(_ROLES)}")
    content = message.get("content")
    if (
        content is not None
        and not isinstance(content, str)
        and not (
            isinstance(content, list)
            and all(isinstance(p, Mapping) and isinstance(p.get("type"), str) for p in content)
        )
    ):
        raise BadRequest(f"messages[{k}].content must be a string, null or a list of content parts")
    calls = message.get("tool_calls")
    if calls is not None and (not isinstance(calls, list) or not all(_is_call(c) for c in calls)):
        raise BadRequest(f"messages[{k}].tool_calls must be a list of {{'function': {{'name', 'arguments'}}}}")
    for key in ("tool_call_id", "name"):
        if message.get(key) is not None and not isinstance(message[key], str):
            raise BadRequest(f"messages[{k}].{key} must be a string")


def _is_call(call: object) -> bool:
    function = call.get("function") if isinstance(call, Mapping) else None
    return (
        isinstance(function, Mapping)
        and isinstance(function.get("name"), str)
        and isinstance(function.get("arguments", "{}"), str | Mapping)
    )


def _is_tool(tool: object) -> bool:
    function = tool.get("function") if isinstance(tool, Mapping) else None
    return isinstance(function, Mapping) and isinstance(function.get("name"), str)


def _asks(body: Mapping[str, object], key: str) -> bool:
    value = body.get(key)
    if key == "n":
        return value is not None and value != 1
    return bool(value)


def _error(status: int, message: str, kind: str = "ep_trl_error") -> web.Response:
    from aiohttp import web

    return web.json_response({"error": {"message": message, "type": kind, "code": status}}, status=status)
