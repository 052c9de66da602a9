"""Client-side CPU per ``/v1/completions`` request: aiohttp (what ep_trl's vLLM backend uses) vs httpx.

    python benchmarks/http_client_cpu.py                  # starts a CPU vLLM server with the tiny model
    python benchmarks/http_client_cpu.py --vllm-url URL   # or uses a running one

The bridge's own CPU competes with the server and the environment on a small machine, and HTTP was the largest
part of it (docs/benchmarks.md), so the async client was chosen by this number. Each client sends the same
short request (60 prompt tokens, 2 sampled tokens, logprobs and token ids returned) ``--requests`` times, one at
a time, after one warm-up request; ``time.process_time()`` of this process around the loop is the client's CPU.
"""

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import httpx

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from ep_trl.devtools import run_record  # noqa: E402


def body(model: str) -> dict:
    return {"model": model, "prompt": list(range(60)), "max_tokens": 2, "logprobs": 0, "return_token_ids": True}


async def with_aiohttp(url: str, payload: dict, n: int) -> tuple[float, float]:
    async with aiohttp.ClientSession() as session:

        async def once() -> None:
            async with session.post(f"{url}/v1/completions", json=payload) as response:
                json.loads(await response.text())

        return await timed(once, n)


async def with_httpx_async(url: str, payload: dict, n: int) -> tuple[float, float]:
    async with httpx.AsyncClient(timeout=60) as client:

        async def once() -> None:
            (await client.post(f"{url}/v1/completions", json=payload)).json()

        return await timed(once, n)


async def timed(once: Callable[[], Awaitable[None]], n: int) -> tuple[float, float]:
    await once()  # warm-up: connection, first-request paths
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(n):
        await once()
    return (time.process_time() - cpu) / n * 1000, (time.perf_counter() - wall) / n * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--vllm-url", help="a running server with the tiny model (default: start one)")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = parser.parse_args()
    record = run_record.start(REPO_ROOT)
    with tempfile.TemporaryDirectory(prefix="ep-trl-http-") as tmp:
        server = None
        if args.vllm_url:
            url = args.vllm_url.rstrip("/")
        else:
            from ep_trl.devtools.tiny_model import build_tiny_model
            from tests.support.vllm_server import start_vllm_server

            server = start_vllm_server(build_tiny_model(Path(tmp) / "tiny_model", seed=0), Path(tmp) / "logs")
            url = server.base_url
        try:
            payload = body(httpx.get(f"{url}/v1/models").json()["data"][0]["id"])
            results: dict[str, list[tuple[float, float]]] = {"aiohttp": [], "httpx.AsyncClient": []}
            for _ in range(args.repeats):  # interleaved, so load from elsewhere hits both alike
                results["aiohttp"].append(asyncio.run(with_aiohttp(url, payload, args.requests)))
                results["httpx.AsyncClient"].append(asyncio.run(with_httpx_async(url, payload, args.requests)))
        finally:
            if server is not None:
                from tests.support.vllm_server import stop_vllm_server

                stop_vllm_server(server)
    print("| client | client CPU ms/request (median) | range | wall ms/request (median) |")
    print("|---|---|---|---|")
    for name, runs in results.items():
        cpu = [c for c, _ in runs]
        print(
            f"| {name} | {statistics.median(cpu):.2f} | {min(cpu):.2f}-{max(cpu):.2f} | "
            f"{statistics.median(w for _, w in runs):.1f} |"
        )
    if args.out:
        runs = [
            {"client": name, "repeat": repeat, "requests": args.requests, "cpu_ms": cpu, "wall_ms": wall}
            for name, measured in results.items()
            for repeat, (cpu, wall) in enumerate(measured)
        ]
        args.out.write_text(json.dumps({"run": run_record.finish(record), "runs": runs}, indent=1) + "\n")


if __name__ == "__main__":
    main()
