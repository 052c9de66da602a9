#!/usr/bin/env python
"""Train a policy with GRPO on the letters game through its eval-protocol eval (ep_trl's browser-free CPU demo).

With no arguments: builds a tiny model locally (random weights), starts the letters environment server and trains
it with in-process generation on the CPU, printing the eval's score per step. The game rewards each word by the
share of its characters in the task's alphabet (vowels, abc); the random model starts near 0.3 and learns to write
those letters (`tests/project/test_train_letters_script.py` checks that it trains). At the end it prints the mean
score of the first and last steps and writes a plot of the score per step (reward_curve.png in --output-dir). See
README.md.

A preset of `ep-trl train` (docs/cli.md): this script fills its defaults and calls it, so the run writes the same
run folder (config.yaml, metrics.jsonl, reward_curve.png, result.json, checkpoint/).

Other generation modes (ep_trl.cli.modes; on a machine with a GPU, every mode trains there):
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


def parse_args(argv=None):
    from ep_trl.cli.modes import add_generation_flags, check_generation_flags

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--env-path",
        default=str(ROOT / "evals" / "eval_letters.py") + "::test_letters",
        help="eval test to train on (module::test or file.py::test)",
    )
    p.add_argument("--env-url", default=None, help="letters server URL; default: start one on a free port")
    p.add_argument("--model", default=None, help="model path; default: a tiny model built locally")
    add_generation_flags(p)
    p.add_argument("--max-steps", type=int, default=100)
    p.add_argument("--num-generations", type=int, default=8, help="episodes per prompt group (GRPO group size)")
    p.add_argument("--batch-size", type=int, default=16, help="episodes per optimizer step")
    p.add_argument("--learning-rate", type=float, default=3e-3)
    p.add_argument("--optim", default="adamw_torch", help="transformers optimizer name")
    p.add_argument("--max-completion-length", type=int, default=128)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--output-dir", default="outputs/letters")
    p.add_argument("--report-to", default="none")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    check_generation_flags(p, args)
    return args


def main(argv=None) -> int:
    """``ep-trl train`` with this script's defaults: the letters eval, its server started for the run, the tiny model
    (built locally) unless --model is given."""
    args = parse_args(argv)
    from ep_trl.cli import train
    from ep_trl.cli.presets import script_defaults
    from ep_trl.devtools.tiny_model import build_tiny_model

    def tiny_model(env_url, model):
        return model or str(build_tiny_model(Path(args.output_dir) / "tiny-model", seed=args.seed))

    return train.main(
        [],
        train.Preset(
            prog=Path(__file__).name,
            title=f"{Path(__file__).name}: eval score on the letters game",
            defaults=script_defaults(args, "ep_trl.envs.letters", "LETTERS_ENV_URL"),
            start_model=tiny_model,
            command=[sys.executable, __file__, *(sys.argv[1:] if argv is None else argv)],
        ),
    )


if __name__ == "__main__":
    sys.exit(main())
