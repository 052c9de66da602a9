#!/usr/bin/env python
"""What logging training rollouts to eval-protocol's store costs: rollout-call wall time with it on and off.

Builds the tiny model, starts the letters environment server, and calls two rollout functions on the same
trainer, one with ``log_rollouts=True`` (the default store, under a temporary HOME so a developer's
``~/.eval_protocol`` is untouched) and one with ``log_rollouts=False``, alternating calls so that load drift
hits both alike. Rows are not flushed between calls: the writer thread competes with the next call, as in
training. Prints, per mode, the median and spread of call wall times and the median process CPU time per call
(all threads; less sensitive than wall time to other processes on a shared machine), and the writer's own time
(time in ``log()`` on the training path, the background thread's time, the token views' share of it).
Writes every call and the summary to ``--out`` with the run's record (``ep_trl.devtools.run_record``).
Results: docs/ep-logs.md.

    python benchmarks/logging_overhead.py --repeats 25 --out benchmarks/results/logging_overhead.json
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ["HOME"] = tempfile.mkdtemp(prefix="ep-trl-bench-home-")  # before eval_protocol picks its store

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE))

from ep_trl.devtools import run_record  # noqa: E402

EVAL = str(HERE / "evals" / "eval_letters.py") + "::test_letters"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=7, help="timed calls per mode (after one warm-up call each)")
    p.add_argument("--episodes", type=int, default=16, help="episodes per rollout call (prompts)")
    p.add_argument("--num-generations", type=int, default=4)
    p.add_argument("--max-steps", type=int, default=4, help="environment steps per episode")
    p.add_argument("--max-tokens", type=int, default=16, help="sampled tokens per turn")
    p.add_argument(
        "--no-warm-up",
        dest="warm_up",
        action="store_false",
        help="no warm-up call before the timed ones (for smoke runs: the first call's set-up is timed)",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=HERE / "benchmarks" / "results" / "logging_overhead.json",
        help="the result file: every timed call, the summary and the run's record",
    )
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    record = run_record.start(HERE, None if argv is None else [sys.argv[0], *argv])
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from ep_trl import EvalOverrides, create_openenv_vllm_rollout_func
    from ep_trl.cli.env_server import local_env_server
    from ep_trl.devtools.tiny_model import build_tiny_model
    from ep_trl.rewards import eval_score

    work = Path(tempfile.mkdtemp(prefix="ep-trl-bench-"))
    model_dir = build_tiny_model(work / "tiny-model", seed=0)
    prompts = [f"Play the letters game, round {i // args.num_generations}." for i in range(args.episodes)]
    options = dict(overrides=EvalOverrides(max_steps=args.max_steps, max_tokens=args.max_tokens))
    with local_env_server("ep_trl.envs.letters") as url:
        os.environ["LETTERS_ENV_URL"] = url
        fns = {
            "on": create_openenv_vllm_rollout_func(EVAL, **options),
            "off": create_openenv_vllm_rollout_func(EVAL, log_rollouts=False, **options),
        }
        config = GRPOConfig(
            output_dir=str(work / "out"),
            use_cpu=True,
            bf16=False,
            report_to=[],
            per_device_train_batch_size=args.episodes,
            num_generations=args.num_generations,
            max_completion_length=512,
            max_steps=1,
            save_strategy="no",
            seed=0,
        )
        trainer = GRPOTrainer(
            model=AutoModelForCausalLM.from_pretrained(model_dir),
            processing_class=AutoTokenizer.from_pretrained(model_dir),
            reward_funcs=[eval_score],
            args=config,
            train_dataset=Dataset.from_dict({"prompt": prompts}),
            rollout_func=fns["off"],
        )
        times: dict[str, list[float]] = {"on": [], "off": []}
        cpu: dict[str, list[float]] = {"on": [], "off": []}
        runs: list[dict] = []
        try:
            for fn in fns.values() if args.warm_up else ():
                fn(prompts, trainer)  # warm-up: generator set-up, first connections
            fns["on"].flush_logs()
            writer = fns["on"].log_writer
            base = (writer.enqueue_s, writer.write_s, writer.token_view_s, writer.written, writer.queued)
            for r in range(args.repeats):
                for mode in ("on", "off") if r % 2 == 0 else ("off", "on"):
                    started, cpu_started = time.perf_counter(), time.process_time()
                    fns[mode](prompts, trainer)
                    times[mode].append(time.perf_counter() - started)
                    cpu[mode].append(time.process_time() - cpu_started)
                    runs.append(
                        {
                            "repeat": r,
                            "logging": mode,
                            "wall_s": times[mode][-1],
                            "cpu_s": cpu[mode][-1],
                            "load_1min": round(os.getloadavg()[0], 2),
                        }
                    )
            started = time.perf_counter()
            fns["on"].flush_logs()
            flush_s = time.perf_counter() - started
        finally:
            for fn in fns.values():
                fn.close()
    enqueue_s, write_s, view_s, written, queued = (
        now - before
        for now, before in zip(
            (writer.enqueue_s, writer.write_s, writer.token_view_s, writer.written, writer.queued), base
        )
    )
    on, off = statistics.median(times["on"]), statistics.median(times["off"])
    calls = args.repeats
    print(
        f"{args.episodes} episodes x {args.max_steps} steps x {args.max_tokens} tokens per call, "
        f"{calls} calls per mode, {os.cpu_count()} CPUs"
    )
    for mode in ("off", "on"):
        t = times[mode]
        print(
            f"  logging {mode:3s}: median {statistics.median(t):.3f} s per call "
            f"(min {min(t):.3f}, max {max(t):.3f}); CPU {statistics.median(cpu[mode]):.3f} s per call"
        )
    cpu_on, cpu_off = statistics.median(cpu["on"]), statistics.median(cpu["off"])
    print(
        f"  difference of medians: wall {on - off:+.3f} s ({(on - off) / off:+.1%}), "
        f"CPU {cpu_on - cpu_off:+.3f} s ({(cpu_on - cpu_off) / cpu_off:+.1%})"
    )
    paired = sorted(a - b for a, b in zip(times["on"], times["off"]))  # same repeat: drift cancels
    q1, q3 = paired[len(paired) // 4], paired[(3 * len(paired)) // 4]
    print(
        f"  paired (on - off, same repeat): median {statistics.median(paired):+.3f} s, "
        f"quartiles {q1:+.3f} .. {q3:+.3f} s"
    )
    print(
        f"  on the training path (log()): {enqueue_s / calls * 1e3:.1f} ms per call "
        f"({enqueue_s / max(1, queued) * 1e6:.0f} us per queued row)"
    )
    print(
        f"  writer thread: {write_s / calls * 1e3:.1f} ms per call, {written} rows written "
        f"({write_s / max(1, written) * 1e3:.2f} ms per row; token views {view_s / calls * 1e3:.1f} ms per call)"
    )
    print(f"  final flush: {flush_s * 1e3:.0f} ms; store: {Path(os.environ['HOME'], '.eval_protocol', 'logs.db')}")
    summary = {
        "median_wall_s": {"off": off, "on": on},
        "median_cpu_s": {"off": cpu_off, "on": cpu_on},
        "wall_range_s": {mode: [min(times[mode]), max(times[mode])] for mode in times},
        "paired_on_minus_off_s": {"median": statistics.median(paired), "q1": q1, "q3": q3},
        "log_call_ms_per_call": enqueue_s / calls * 1e3,
        "log_call_us_per_row": enqueue_s / max(1, queued) * 1e6,
        "writer_ms_per_call": write_s / calls * 1e3,
        "rows_written": written,
        "writer_ms_per_row": write_s / max(1, written) * 1e3,
        "token_views_ms_per_call": view_s / calls * 1e3,
        "final_flush_ms": flush_s * 1e3,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    args.out.write_text(
        json.dumps({"run": run_record.finish(record), "settings": settings, "summary": summary, "runs": runs}, indent=1)
        + "\n"
    )
    print(f"result: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
