"""Serve a local model behind the same OpenAI-compatible endpoint training uses, to run an eval with it.

``ep-trl serve MODEL_DIR --port 8000`` answers ``POST /v1/chat/completions`` (tools included) for any
model name, generating with the model in this process (transformers, CPU or GPU) and parsing tool calls with the
parser TRL provides for its chat template. Then the eval file you train on is still an eval, unchanged::

    HOSTED_VLLM_API_BASE=http://127.0.0.1:8000/v1 pytest path/to/eval.py --ep-input-param model=hosted_vllm/local

(``--ep-input-param`` replaces the eval's model, keeping its other completion params; ``HOSTED_VLLM_API_BASE``
points LiteLLM's ``hosted_vllm`` provider here, which every processor honours.) Each call is answered on its own:
the request's messages and tools are rendered with the model's chat template and sampled at ``--temperature``
(the request's sampling settings are not used: the trainer backend samples, it does not decode greedily).
"""

import argparse
import asyncio
import itertools
import logging
import signal
from pathlib import Path

from ..capture.endpoint import CaptureEndpoint
from ..capture.parsing import ToolCallParser
from ..capture.placement import RolloutCapture
from ..generation import DEFAULT_MAX_TOKENS, Generator, SamplingParams
from ..generation.choice import make_generator
from ..options import VLLMOptions
from ..trajectory.template import ChatTemplate
from ..trajectory.tokens import TurnLimits, eos_token_ids

logger = logging.getLogger(__name__)


def build_endpoint(model_dir: str | Path, temperature: float = 1.0) -> tuple[CaptureEndpoint, Generator]:
    """An endpoint answering every call with the model at ``model_dir``, and the generator to close after it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if temperature <= 0:
        raise ValueError("--temperature must be > 0 (the in-process backend samples)")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    eos = eos_token_ids(tokenizer, model)
    generator = make_generator(
        "trainer",
        None,
        VLLMOptions(),
        1,
        colocated_trainer=None,
        server=None,
        model_provider=lambda: model,
        processing_class=tokenizer,
    )
    max_len = generator.max_model_len or 4096
    limits = TurnLimits(
        sampling=SamplingParams(temperature=temperature, max_tokens=DEFAULT_MAX_TOKENS),
        max_episode_tokens=max_len,
        stop_token_ids=eos,
        max_model_len=max_len,
    )
    template, parser = ChatTemplate(tokenizer), ToolCallParser(tokenizer)
    calls = itertools.count(1)

    def answer(model_name: str) -> RolloutCapture:
        call = next(calls)
        logger.info("call %d (model %r)", call, model_name)
        return RolloutCapture(f"serve-{call}", model_name, limits, template, generator, parser)

    return CaptureEndpoint(serve_any=answer), generator


async def _serve(model_dir: str, host: str, port: int, temperature: float) -> None:
    endpoint, generator = build_endpoint(model_dir, temperature)
    await endpoint.start(host, port)
    print(f"ep-trl serve: {model_dir} at {endpoint.base_url}", flush=True)
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(signum, stop.set)
    try:
        await stop.wait()
    finally:
        await endpoint.aclose()
        await generator.aclose()


def main(argv: list[str] | None = None, prog: str = "ep-trl serve") -> int:
    """``ep-trl serve MODEL_DIR [--host H] [--port P] [--temperature T]``: serve until Ctrl-C or SIGTERM; 0."""
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir", help="a local Hugging Face model directory (weights, tokenizer, chat template)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--temperature", type=float, default=1.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    asyncio.run(_serve(args.model_dir, args.host, args.port, args.temperature))
    return 0


if __name__ == "__main__":
    main()
