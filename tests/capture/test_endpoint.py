"""The endpoint serves only the eval's own processor, and refuses what it cannot serve faithfully, naming why.

Each case an adversarial probe found on a live endpoint (issue 21): listed rollout names, requests without the
call's key, malformed fields, stray model names remembered forever, non-JSON and non-object bodies."""

import asyncio
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import aiohttp
import pytest

from ep_trl.capture.endpoint import MAX_NAME_CHARS, MAX_UNKNOWN_MODELS, MODEL_PREFIX, CaptureEndpoint, new_token
from ep_trl.capture.parsing import ToolCallParser
from ep_trl.capture.placement import RolloutCapture, TurnReply
from ep_trl.generation import Generator
from ep_trl.trajectory.template import ChatTemplate
from ep_trl.trajectory.tokens import TurnLimits

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from openai.types.chat import ChatCompletionFunctionToolParam

    from ep_trl.capture.placement import TurnRequest

T = TypeVar("T")

MESSAGES = [{"role": "user", "content": "hi"}]


class RecordingCapture(RolloutCapture):
    """Fault-injection stand-in for a rollout's capture: records the requests that reach it, answers "ok"."""

    def __init__(self) -> None:
        # turn() is overridden, so the capture's limits, template, generator and parser are never read: None stands in
        super().__init__(
            new_token(),
            "test",
            cast(TurnLimits, None),
            cast(ChatTemplate, None),
            cast(Generator, None),
            cast(ToolCallParser, None),
        )
        self.requests: list[TurnRequest] = []

    async def turn(self, request: "TurnRequest") -> TurnReply:
        self.calls += 1
        self.requests.append(request)
        return TurnReply({"role": "assistant", "content": "ok"}, "stop", 1, (1,))


async def send(
    url: str | None,
    body: object = None,
    *,
    key: str | None = None,
    data: str | None = None,
    content_type: str | None = "application/json",
    method: str = "POST",
    path: str = "/chat/completions",
) -> tuple[int, Any]:
    assert url is not None, "the endpoint is started"
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    if data is None and body is not None:
        data = json.dumps(body)
    if content_type is not None:
        headers["Content-Type"] = content_type
    async with aiohttp.ClientSession() as session:
        async with session.request(method, f"{url}{path}", data=data, headers=headers) as response:
            payload = await response.json()
            return response.status, payload


def serve(scenario: "Callable[[CaptureEndpoint, RecordingCapture, str], Awaitable[T]]") -> T:
    """Run ``scenario(endpoint, capture, key)`` against a started endpoint holding one live rollout."""

    async def main() -> T:
        endpoint = CaptureEndpoint()
        capture = RecordingCapture()
        endpoint.add(capture)
        key = endpoint.new_call()
        await endpoint.start()
        try:
            return await scenario(endpoint, capture, key)
        finally:
            await endpoint.aclose()

    return asyncio.run(main())


def message(payload: Any) -> str:
    return payload["error"]["message"]


def test_rollouts_are_never_listed_and_the_list_needs_the_key() -> None:
    async def scenario(
        endpoint: CaptureEndpoint, capture: RecordingCapture, key: str
    ) -> tuple[tuple[int, Any], tuple[int, Any]]:
        return (
            await send(endpoint.base_url, method="GET", path="/models", content_type=None),
            await send(endpoint.base_url, method="GET", path="/models", content_type=None, key=key),
        )

    (anonymous, _), (status, listed) = serve(scenario)
    assert anonymous == 401 and status == 200
    assert all(capture_name not in json.dumps(listed) for capture_name in ("ep-trl/0", "rollout"))
    assert [entry["id"] for entry in listed["data"]] == ["ep-trl"]


def test_a_request_without_the_calls_key_never_reaches_the_rollout() -> None:
    async def scenario(
        endpoint: CaptureEndpoint, capture: RecordingCapture, key: str
    ) -> tuple[list[tuple[int, Any]], RecordingCapture]:
        name = MODEL_PREFIX + capture.token
        body = {"model": name, "messages": [{"role": "user", "content": "INJECTED"}]}
        results = [
            await send(endpoint.base_url, body),
            await send(endpoint.base_url, body, key="guessed"),
            await send(endpoint.base_url, {**body, "model": "hosted_vllm/" + name}, key=key + "x"),
        ]
        endpoint.new_call()  # the next rollout call: the last call's key stops working
        results.append(await send(endpoint.base_url, body, key=key))
        return results, capture

    results, capture = serve(scenario)
    assert [status for status, _ in results] == [401] * 4
    assert "api_key" in message(results[0][1])
    assert capture.requests == [] and capture.unauthorized == 4  # counted, for the error that names the fix


def test_a_malformed_field_is_answered_400_and_never_reaches_the_rollout() -> None:
    malformed: list[dict[str, Any]] = [
        {"max_tokens": "abc"},
        {"max_tokens": True},
        {"max_tokens": 0},
        {"max_completion_tokens": 2.5},
        {"stop": 3},
        {"stop": [""]},
        {"tools": "add"},
        {"tools": [{"function": {}}]},
        {"messages": "hi"},
        {"messages": [{"role": "hacker", "content": "x"}]},
        {"messages": [{"role": "user", "content": 5}]},
        {"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": 1}}]}]},
        {"messages": [{"role": "tool", "content": "x", "tool_call_id": 7}]},
        {"temperature": "hot"},
        {"seed": "x"},
        {"tool_choice": 3},
    ]

    async def scenario(
        endpoint: CaptureEndpoint, capture: RecordingCapture, key: str
    ) -> tuple[list[tuple[int, Any]], RecordingCapture]:
        name = MODEL_PREFIX + capture.token
        out = [
            await send(endpoint.base_url, {"model": name, "messages": MESSAGES, **fields}, key=key)
            for fields in malformed
        ]
        out.append(await send(endpoint.base_url, {"model": name, "messages": MESSAGES, "max_tokens": 4}, key=key))
        return out, capture

    results, capture = serve(scenario)
    assert [status for status, _ in results[:-1]] == [400] * len(malformed), [message(p) for _, p in results]
    assert results[-1][0] == 200 and len(capture.requests) == 1 and capture.requests[0].max_tokens == 4


def test_bodies_that_are_not_a_json_object_are_refused() -> None:
    async def scenario(
        endpoint: CaptureEndpoint, capture: RecordingCapture, key: str
    ) -> tuple[list[tuple[int, Any]], RecordingCapture]:
        name = MODEL_PREFIX + capture.token
        text = json.dumps({"model": name, "messages": MESSAGES})
        return (
            [await send(endpoint.base_url, data=text, key=key, content_type="text/plain")]
            + [await send(endpoint.base_url, data=body, key=key) for body in ("[1,2,3]", "null", "{")],
            capture,
        )

    results, capture = serve(scenario)
    assert [status for status, _ in results] == [415, 400, 400, 400] and capture.requests == []
    assert "application/json" in message(results[0][1]) and "list" in message(results[1][1])


def test_unknown_model_names_are_kept_per_call_bounded_and_only_with_the_key() -> None:
    async def scenario(
        endpoint: CaptureEndpoint, capture: RecordingCapture, key: str
    ) -> tuple[list[str], list[str], list[str]]:
        await send(endpoint.base_url, {"model": "gpt-4", "messages": MESSAGES})  # another process: no key
        anonymous = list(endpoint.unknown_models)
        long_name = "x" * 1_000_000
        for k in range(MAX_UNKNOWN_MODELS + 5):
            await send(endpoint.base_url, {"model": f"{long_name}{k}", "messages": MESSAGES}, key=key)
        this_call = list(endpoint.unknown_models)
        endpoint.new_call()
        return anonymous, this_call, list(endpoint.unknown_models)

    anonymous, this_call, next_call = serve(scenario)
    assert anonymous == []  # never remembered: it cannot fail training
    assert len(this_call) == MAX_UNKNOWN_MODELS and all(len(name) <= MAX_NAME_CHARS for name in this_call)
    assert next_call == []  # cleared with every call


def test_streaming_several_choices_and_constrained_decoding_are_refused() -> None:
    async def scenario(endpoint: CaptureEndpoint, capture: RecordingCapture, key: str) -> list[tuple[int, Any]]:
        name = MODEL_PREFIX + capture.token
        bodies: list[dict[str, Any]] = [
            {"model": "ep-trl/unknown"},
            {"model": name, "stream": True},
            {"model": name, "n": 2},
            {"model": name, "response_format": {"type": "json"}},
            {"model": name, "messages": []},
        ]
        return [await send(endpoint.base_url, {"messages": MESSAGES, **body}, key=key) for body in bodies]

    unknown_rollout, stream, several, constrained, empty = serve(scenario)
    assert unknown_rollout[0] == 404 and "not a rollout ep_trl is capturing" in message(unknown_rollout[1])
    assert stream == (
        400,
        {
            "error": {
                "message": "streaming is not served; ep_trl removes stream=True from the eval's completion_params",
                "type": "ep_trl_error",
                "code": 400,
            }
        },
    )
    assert several[0] == 400 and "n=1" in message(several[1])
    assert constrained[0] == 400 and "constrained decoding" in message(constrained[1])
    assert empty[0] == 400 and "messages" in message(empty[1])


def test_rollout_tokens_carry_128_random_bits() -> None:
    tokens = {new_token() for _ in range(1000)}
    assert len(tokens) == 1000 and all(len(t) == 32 and int(t, 16) >= 0 for t in tokens)


# --- configuration errors: answered 400, once -------------------------------------------------------------------

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lake_move",
            "parameters": {"type": "object", "properties": {"action": {"type": "string"}}, "required": ["action"]},
        },
    }
]


def chatml_capture(model_dir: Path) -> RolloutCapture:
    """A real rollout capture over the tiny model's own ChatML template, which has no tool-call format TRL knows: a
    call that offers tools raises ep_trl's ConfigError while it is served (before anything is generated)."""
    from transformers import AutoTokenizer

    from ep_trl.capture.parsing import ToolCallParser
    from ep_trl.trajectory.template import ChatTemplate

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    # the call fails before anything is generated: the limits and the generator are never read, None stands in
    return RolloutCapture(
        new_token(),
        "chatml",
        cast(TurnLimits, None),
        ChatTemplate(tokenizer),
        cast(Generator, None),
        ToolCallParser(tokenizer),
    )


def serve_capture(capture: RolloutCapture, scenario: "Callable[[CaptureEndpoint, str], Awaitable[T]]") -> T:
    async def main() -> T:
        endpoint = CaptureEndpoint()
        endpoint.add(capture)
        key = endpoint.new_call()
        await endpoint.start()
        try:
            return await scenario(endpoint, key)
        finally:
            await endpoint.aclose()

    return asyncio.run(main())


def test_a_configuration_error_is_answered_400_once_through_eval_protocols_litellm_policy(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 47: tools offered to a model whose template has no tool-call format raised ConfigError while serving the
    call, answered 500 ("LiteLLM Retried: 8 times"). The call is made by eval-protocol's own LiteLLMPolicy, as its
    MCP-gym and agent processors make it (num_retries=8): one request reaches the endpoint, answered 400 with ep_trl's
    message in the OpenAI error body, and LiteLLM raises BadRequestError. (LiteLLM's num_retries resends any error,
    4xx included, when ``tenacity`` is installed; it is not in this environment, as the request count shows.)"""
    import litellm
    from eval_protocol.mcp.execution.policy import LiteLLMPolicy

    from ep_trl.errors import ConfigError

    capture = chatml_capture(tiny_model_dir)

    async def scenario(endpoint: CaptureEndpoint, key: str) -> "litellm.BadRequestError":
        monkeypatch.setenv("HOSTED_VLLM_API_KEY", key)  # what ep_trl points the processor's LiteLLM at
        policy = LiteLLMPolicy(
            model_id=f"hosted_vllm/{MODEL_PREFIX}{capture.token}",
            temperature=0.0,
            max_tokens=8,
            base_url=endpoint.base_url,
        )
        try:
            await policy._make_llm_call([{"role": "user", "content": "move"}], TOOLS)
        except litellm.BadRequestError as error:
            return error
        raise AssertionError("the call succeeded")

    error = serve_capture(capture, scenario)
    assert capture.calls == 1  # the endpoint received exactly one request
    assert error.status_code == 400
    assert "TRL knows no tool-call format" in str(error) and "--chat-template qwen2_5" in str(error)
    assert isinstance(capture.fatal, ConfigError)  # kept: the rollout raises it once the processor returns


def test_an_openai_client_does_not_retry_a_configuration_error(tiny_model_dir: Path) -> None:
    """The OpenAI client retries 5xx answers (twice by default) and not 4xx: with the old 500 the endpoint received
    three requests for one call; now one, and the client's error carries ep_trl's message."""
    import openai

    capture = chatml_capture(tiny_model_dir)

    async def scenario(endpoint: CaptureEndpoint, key: str) -> "openai.BadRequestError":
        client = openai.AsyncOpenAI(base_url=endpoint.base_url, api_key=key)
        try:
            await client.chat.completions.create(
                model=f"{MODEL_PREFIX}{capture.token}",
                tools=cast("list[ChatCompletionFunctionToolParam]", TOOLS),
                messages=[{"role": "user", "content": "move"}],
            )
        except openai.BadRequestError as error:
            return error
        finally:
            await client.close()
        raise AssertionError("the call succeeded")

    error = serve_capture(capture, scenario)
    assert capture.calls == 1
    assert isinstance(error.body, dict)
    assert error.status_code == 400 and error.body["type"] == "invalid_request_error"
    assert "TRL knows no tool-call format" in error.body["message"]
