"""The OpenAI-compatible endpoint the eval's processor calls during training, served on 127.0.0.1 by ep_trl.

``POST /v1/chat/completions`` (tools included, no streaming) and ``GET /v1/models``. The request's ``model`` names
the rollout: ``ep-trl/<token>``, the model alias ep_trl gives each row before handing it to the processor (through
LiteLLM's ``hosted_vllm/`` provider that is ``hosted_vllm/ep-trl/<token>``). Each call is answered by that rollout's
``RolloutCapture``, which generates with the configured backend and records the tokens.

Why not a proxy that exists: openenv 0.10's capture proxy forwards to an HTTP engine that renders and parses
(so not to the in-process trainer backend), tells rollouts apart by API key (AgentRolloutProcessor sends none of
its own), and is not part of openenv-core 0.3; eval-protocol's token-in client speaks Fireworks' API only.
docs/processors.md has the details.
"""

import logging
import socket
import time
from collections.abc import Callable, Mapping
from typing import Any

from ..episode import EpisodeFailure
from .capture import RolloutCapture, TurnRequest

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


class CaptureEndpoint:
    """Serves the captured rollouts' model calls; started and stopped on the rollout function's event loop."""

    def __init__(self, serve_any: Callable[[str], RolloutCapture] | None = None) -> None:
        """``serve_any``: for a model name that is no captured rollout, a fresh capture that answers that one call
        (``ep_trl.serve``); without it such a call is refused."""
        self._serve_any = serve_any
        self._captures: dict[str, RolloutCapture] = {}
        self.unknown_models: set[str] = set()  # names called that are no rollout: the processor ignores the row's
        self._runner: Any = None
        self.base_url: str | None = None

    @property
    def running(self) -> bool:
        return self._runner is not None

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

    async def _models(self, request: Any) -> Any:
        from aiohttp import web

        return web.json_response({"object": "list", "data": [
            {"id": MODEL_PREFIX + token, "object": "model", "owned_by": "ep_trl"} for token in self._captures]})

    async def _chat(self, request: Any) -> Any:
        from aiohttp import web

        try:
            body = await request.json()
        except ValueError:
            return _error(400, "the request body is not JSON")
        model = str(body.get("model", ""))
        name = model.split("/", 1)[1] if model.startswith("hosted_vllm/") else model  # as plain OpenAI clients send it
        capture = self._captures.get(name[len(MODEL_PREFIX):]) if name.startswith(MODEL_PREFIX) else None
        if capture is None and self._serve_any is not None:
            capture = self._serve_any(model)
        if capture is None:
            self.unknown_models.add(model)
            return _error(404, f"model {model!r} is not a rollout ep_trl is capturing: ep_trl gives each row the model "
                               f"'hosted_vllm/{MODEL_PREFIX}<token>' in its completion_params; the processor must "
                               "call the model the row names")
        refused = [reason for key, reason in _REFUSED.items() if _asks(body, key)]
        if refused:
            return _error(400, "; ".join(refused))
        messages = body.get("messages")
        if not isinstance(messages, list) or not all(isinstance(m, Mapping) for m in messages) or not messages:
            return _error(400, "messages must be a non-empty list of message objects")
        stop = body.get("stop") or ()
        turn = TurnRequest(
            messages=tuple(messages),
            tools=tuple(body["tools"]) if body.get("tools") else None,
            max_tokens=body.get("max_completion_tokens") or body.get("max_tokens"),
            stop=(stop,) if isinstance(stop, str) else tuple(stop),
        )
        try:
            reply = await capture.turn(turn)
        except EpisodeFailure as exc:
            return _error(502, f"generation failed: {exc}")
        except Exception as exc:  # kept by the capture and raised by the rollout once the processor returns
            return _error(500, f"ep_trl could not serve this call: {type(exc).__name__}: {exc}")
        return web.json_response({
            "id": f"chatcmpl-{capture.token}-{capture.calls}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [{"index": 0, "message": reply.message, "finish_reason": reply.finish_reason}],
            "usage": {"prompt_tokens": reply.prompt_tokens, "completion_tokens": len(reply.completion_ids),
                      "total_tokens": reply.prompt_tokens + len(reply.completion_ids)},
        })


def _asks(body: Mapping[str, Any], key: str) -> bool:
    value = body.get(key)
    if key == "n":
        return value is not None and value != 1
    return bool(value)


def _error(status: int, message: str) -> Any:
    from aiohttp import web

    return web.json_response({"error": {"message": message, "type": "ep_trl_error", "code": status}}, status=status)
