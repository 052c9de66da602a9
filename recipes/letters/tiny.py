#!/usr/bin/env python
"""Train a tiny model with GRPO on the letters game through its eval-protocol eval (ep_trl's browser-free CPU demo,
the README's "Start here").

With no arguments: builds a tiny model locally (random weights), starts the letters environment server and trains
it with in-process generation on the CPU, printing the eval's score per step. The game rewards each word by the
share of its characters in the task's alphabet (vowels, abc); the random model starts near 0.3 and learns to write
those letters (`tests/project/test_train_letters_script.py` checks that it trains). At the end it prints the mean
score of the first and last steps and writes a plot of the score per step (reward_curve.png in --output-dir). See
README.md.

A preset of `ep-trl train` (docs/cli.md): this recipe fills its defaults and calls it, so the run writes the same
run folder (config.yaml, metrics.jsonl, reward_curve.png, result.json, checkpoint/).

Other generation modes (docs/cli.md; on a machine with a GPU, every mode trains there):
  .venv-colocate/bin/python recipes/letters/tiny.py --vllm-mode colocate  # docs/vllm.md: TRL's engine in the trainer
  python recipes/letters/tiny.py --async --vllm-server-url URL --model DIR  # docs/async.md: DIR is the server's model
"""

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

ROOT = Path(__file__).resolve().parents[2]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from ep_trl.cli import (
        TrainingFlags,
        add_generation_flags,
        add_training_flags,
        check_generation_flags,
        check_training_flags,
        recipe_parser,
    )

    p = recipe_parser(__file__, __doc__)
    add_training_flags(
        p,
        TrainingFlags(
            env_path=str(ROOT / "evals" / "eval_letters.py") + "::test_letters",
            model="a tiny model built locally",
            output_dir="outputs/letters",
            max_steps=100,
            num_generations=8,
            batch_size=16,
            learning_rate=3e-3,
            max_completion_length=128,
        ),
    )
    p.add_argument("--env-url", default=None, help="letters server URL; default: start one on a free port")
    add_generation_flags(p)
    p.add_argument("--optim", default="adamw_torch", help="transformers optimizer name")
    p.add_argument("--report-to", default="none")
    args = p.parse_args(argv)
    check_training_flags(p, args)
    check_generation_flags(p, args)
    return args


def main(argv: list[str] | None = None) -> int:
    """``ep-trl train`` with this recipe's defaults: the letters eval, its server started for the run, the tiny model
    (built locally) unless --model is given."""
    args = parse_args(argv)
    from ep_trl.cli import Preset, env_server_defaults, recipe_command, recipe_name, run_preset
    from ep_trl.devtools.tiny_model import build_tiny_model

    def tiny_model(env_url: str | None, model: str | None) -> str:
        return model or str(build_tiny_model(Path(args.output_dir) / "tiny-model", seed=args.seed))

    return run_preset(
        Preset(
            prog=recipe_name(__file__),
            title=f"{recipe_name(__file__)}: eval score on the letters game",
            defaults=env_server_defaults(args, "ep_trl.envs.letters", "LETTERS_ENV_URL"),
            start_model=tiny_model,
            command=recipe_command(__file__, argv),
        )
    )


if __name__ == "__main__":
    sys.exit(main())
