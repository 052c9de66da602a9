"""FaultyVLLMServer: a deliberately failing stand-in for vLLM's OpenAI-compatible server, for fault injection.

It exists only to make the failures of point 3 of the vLLM-server issue happen on demand (a server that hangs,
drops connections, answers 5xx or 4xx), which a real vLLM server cannot be told to do. It speaks just enough of
the protocol for ep_trl's client: ``GET /health``, ``GET /v1/models`` (with ``max_model_len``) and
``POST /v1/completions`` (one prompt or a list of prompts) answering with canned token ids and logprobs. It
records every completion request (body, prompts, arrival time) and the most prompts in flight at once, so tests
can check overlap, batching and retry counts.
Everything that is not a fault is tested against a real vLLM server in ``tests/generation/test_vllm_real.py``.

Each completion request takes the next action from ``plan`` (then ``default``):

* ``"ok"``: a canned completion (``ok_token_ids`` cut to ``max_tokens``), after ``ok_delay_s``;
* ``("status", code)`` / ``("status", code, message)``: an HTTP error with vLLM's error body;
* ``"hang"``: never answer (until the server is closed);
* ``"drop"``: close the connection without answering;
* ``"no_token_ids"``: HTTP 200 with choices that carry text but no ``token_ids`` (a server that ignores
  ``return_token_ids``, e.g. an older vLLM or another OpenAI-compatible server).

``models_plan`` does the same for ``GET /v1/models`` (``"ok"``, ``("status", code)``, ``"drop"``, ``"hang"``), and
``adapters`` are listed there after the model, as a server with ``--enable-lora`` lists loaded LoRA adapters.

``reject_longer_than`` answers any request holding a prompt longer than that with vLLM's HTTP 400, as a real
server does for a prompt over its ``max_model_len``.
"""

import json
import socket
import threading
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Action = str | tuple


@dataclass
class Recorded:
    """One completion request as the server received it."""

    body: dict[str, Any]
    prompts: list[list[int]]
    received_at: float
    action: Action


@dataclass
class FaultyVLLMServer:
    """A local HTTP server on 127.0.0.1 that fails as told; use as a context manager."""

    plan: Iterable[Action] = ()
    default: Action = "ok"
    ok_token_ids: Sequence[int] = (5, 6, 7)
    ok_logprob: float = -0.5
    ok_delay_s: float = 0.0
    max_model_len: int | None = 512
    model: str = "faulty-model"
    hang_models: bool = False
    models_plan: Iterable[Action] = ()
    adapters: Sequence[str] = ()
    reject_longer_than: int | None = None
    requests: list[Recorded] = field(default_factory=list)
    max_concurrent_prompts: int = 0

    def __post_init__(self) -> None:
        self._plan: deque[Action] = deque(self.plan)
        self._models_plan: deque[Action] = deque(self.models_plan)
        #: How many times ``GET /v1/models`` was asked.
        self.models_requests = 0
        self._lock = threading.Lock()
        self._in_flight = 0
        self._closing = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        assert self._server is not None, "server not started"
        host, port = self._server.server_address[:2]
        assert isinstance(host, str)  # an AF_INET server's address: (host, port)
        return f"http://{host}:{port}"

    def __enter__(self) -> "FaultyVLLMServer":
        handler = _handler_for(self)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="faulty-vllm", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._closing.set()  # releases hanging handlers
        assert self._server is not None and self._thread is not None
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def set_plan(self, plan: Iterable[Action], default: Action | None = None) -> None:
        with self._lock:
            self._plan = deque(plan)
            if default is not None:
                self.default = default

    @property
    def prompts(self) -> list[tuple[list[int], dict[str, Any]]]:
        """Every prompt received, with the other fields of its request, in arrival order."""
        return [(p, {k: v for k, v in r.body.items() if k != "prompt"}) for r in self.requests for p in r.prompts]

    def _next_action(self, body: dict[str, Any], prompts: list[list[int]]) -> Action:
        with self._lock:
            action = self._plan.popleft() if self._plan else self.default
            if self.reject_longer_than is not None and max(len(p) for p in prompts) > self.reject_longer_than:
                action = ("status", 400, f"This model's maximum context length is {self.reject_longer_than} tokens.")
            self.requests.append(Recorded(body, prompts, time.monotonic(), action))
            self._in_flight += len(prompts)
            self.max_concurrent_prompts = max(self.max_concurrent_prompts, self._in_flight)
        return action

    def _done(self, prompts: list[list[int]]) -> None:
        with self._lock:
            self._in_flight -= len(prompts)

    def completion(self, body: dict[str, Any], prompts: list[list[int]]) -> dict[str, Any]:
        """The canned successful answer to ``body``: one choice per prompt."""
        max_tokens = int(body.get("max_tokens") or 16)
        ids = list(self.ok_token_ids)[:max_tokens]
        choices = [
            {
                "index": i,
                "text": "",
                "token_ids": ids,
                "prompt_token_ids": prompt,
                "logprobs": {
                    "token_logprobs": [self.ok_logprob] * len(ids),
                    "tokens": [f"token_id:{t}" for t in ids],
                    "top_logprobs": None,
                    "text_offset": [0] * len(ids),
                },
                "finish_reason": "stop" if len(ids) < max_tokens else "length",
                "stop_reason": None,
            }
            for i, prompt in enumerate(prompts)
        ]
        return {
            "id": "cmpl-faulty",
            "object": "text_completion",
            "model": self.model,
            "choices": choices,
            "usage": {"prompt_tokens": sum(map(len, prompts)), "completion_tokens": len(ids) * len(prompts)},
        }


def _handler_for(server: FaultyVLLMServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # keep test output clean
            return

        def _send(self, code: int, payload: Any) -> None:
            data = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            if self.path == "/health":
                self._send(200, {})
            elif self.path == "/v1/models":
                with server._lock:
                    server.models_requests += 1
                    action = server._models_plan.popleft() if server._models_plan else "ok"
                if server.hang_models:
                    action = "hang"
                if action != "ok":
                    self._act(action, {}, [])
                    return
                entry: dict[str, object] = {"id": server.model, "object": "model"}
                if server.max_model_len is not None:
                    entry["max_model_len"] = server.max_model_len
                adapters = [{"id": name, "object": "model", "parent": server.model} for name in server.adapters]
                self._send(200, {"object": "list", "data": [entry, *adapters]})
            else:
                self._send(404, {"error": {"message": f"no route {self.path}", "code": 404}})

        def do_POST(self) -> None:  # noqa: N802
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            if self.path != "/v1/completions":
                self._send(404, {"error": {"message": f"no route {self.path}", "code": 404}})
                return
            prompt = body.get("prompt") or [[]]
            prompts = prompt if isinstance(prompt[0], list) else [prompt]
            action = server._next_action(body, prompts)
            try:
                self._act(action, body, prompts)
            finally:
                server._done(prompts)

        def _act(self, action: Action, body: dict[str, Any], prompts: list[list[int]]) -> None:
            if action == "ok":
                if server.ok_delay_s:
                    server._closing.wait(server.ok_delay_s)
                self._send(200, server.completion(body, prompts))
            elif action == "hang":
                server._closing.wait(120)
                self.close_connection = True
            elif action == "drop":
                self.connection.shutdown(socket.SHUT_RDWR)
                self.close_connection = True
            elif action == "no_token_ids":
                answer = server.completion(body, prompts)
                for choice in answer["choices"]:
                    del choice["token_ids"]
                self._send(200, answer)
            elif isinstance(action, tuple) and action[0] == "status":
                code = int(action[1])
                message = action[2] if len(action) > 2 else f"injected HTTP {code}"
                self._send(code, {"error": {"message": message, "type": "InjectedError", "code": code}})
            else:
                raise ValueError(f"FaultyVLLMServer: unknown action {action!r}")

    return Handler
