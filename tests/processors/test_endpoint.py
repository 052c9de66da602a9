"""The endpoint refuses what it cannot serve faithfully, naming why, instead of answering something else."""

import asyncio

import aiohttp

from ep_trl.processors.capture import RolloutCapture
from ep_trl.processors.endpoint import CaptureEndpoint


async def post(url, body):
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url}/chat/completions", json=body) as response:
            return response.status, (await response.json())["error"]["message"]


def test_unknown_models_streaming_several_choices_and_constrained_decoding_are_refused():
    async def scenario():
        endpoint = CaptureEndpoint()
        endpoint.add(RolloutCapture("x", "test", None, None, None, None))  # never reached: each call is refused
        await endpoint.start()
        try:
            messages = [{"role": "user", "content": "hi"}]
            bodies = [{"model": "gpt-4o"}, {"model": "ep-trl/unknown"}, {"model": "ep-trl/x", "stream": True},
                      {"model": "ep-trl/x", "n": 2}, {"model": "ep-trl/x", "response_format": {"type": "json"}},
                      {"model": "ep-trl/x", "messages": []}]
            return [await post(endpoint.base_url, {"messages": messages, **body}) for body in bodies]
        finally:
            await endpoint.aclose()

    unknown, unknown_rollout, stream, several, constrained, empty = asyncio.run(scenario())
    assert unknown[0] == 404 and "not a rollout ep_trl is capturing" in unknown[1]
    assert unknown_rollout[0] == 404
    assert stream == (400, "streaming is not served; ep_trl removes stream=True from the eval's completion_params")
    assert several[0] == 400 and "n=1" in several[1]
    assert constrained[0] == 400 and "constrained decoding" in constrained[1]
    assert empty[0] == 400 and "messages" in empty[1]
