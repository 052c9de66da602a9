#!/usr/bin/env python
"""Train a policy with GRPO on the letters game through its eval-protocol eval (ep_trl's browser-free CPU demo).

With no arguments: builds a tiny model locally (random weights), starts the letters environment server and trains
it with in-process generation on the CPU, printing the eval's score per step. The game rewards each word by the
share of its characters in the task's alphabet (vowels, abc); the random model starts near 0.3 and learns to write
those letters (measured: 0.29 to 0.74-0.75 over 100 steps of 16 episodes, about 1.5 minutes on 2 cores). At the end it prints the mean score of the first and last steps and writes a plot of the score per
step (reward_curve.png in --output-dir). See README.md.

Other generation modes (ep_trl.devtools.training_modes; on a machine with a GPU, every mode trains there):
  .venv-colocate/bin/python train_letters_trl.py --vllm-mode colocate  # docs/vllm.md: TRL's engine in the trainer
  python train_letters_trl.py --async --vllm-base-url URL --model DIR  # docs/async.md: DIR is the server's model
"""

import argparse
import os
import sys
import time
from contextlib import nullcontext
from pathlib import Path

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

HERE = Path(__file__).resolve().parent


def parse_args(argv=None):
    from ep_trl.devtools.training_modes import add_generation_flags, check_generation_flags

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env-path", default=str(HERE / "examples" / "letters_eval.py") + "::test_letters",
                   help="eval test to train on (module::test or file.py::test)")
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
    args = parse_args(argv)
    from ep_trl.devtools.scripts import ProgressPrinter, local_env_server, report_training, script_logging

    script_logging()

    from transformers import PrinterCallback

    from ep_trl import dataset_from_eval
    from ep_trl.devtools.tiny_model import build_tiny_model
    from ep_trl.devtools.training_modes import TrainingMode

    started = time.monotonic()
    output = Path(args.output_dir)
    model = args.model or str(build_tiny_model(output / "tiny-model", seed=args.seed))
    mode = TrainingMode.from_args(args)
    print(mode.describe(), flush=True)
    config = mode.config(
        output_dir=str(output), bf16=False, seed=args.seed,
        per_device_train_batch_size=args.batch_size, num_generations=args.num_generations,
        max_completion_length=args.max_completion_length, temperature=args.temperature,
        learning_rate=args.learning_rate, optim=args.optim, max_steps=args.max_steps, logging_steps=1,
        save_strategy="no",
        report_to=[] if args.report_to == "none" else [args.report_to], disable_tqdm=True,
    )
    groups_per_step = max(1, args.batch_size // args.num_generations)
    dataset = dataset_from_eval(args.env_path, repeat=groups_per_step * args.max_steps)

    with (local_env_server("ep_trl.envs.letters") if args.env_url is None else nullcontext(args.env_url)) as env_url:
        os.environ["LETTERS_ENV_URL"] = env_url
        with mode.trainer(args.env_path, model=model, args=config, train_dataset=dataset,
                          callbacks=[ProgressPrinter()]) as trainer:
            trainer.remove_callback(PrinterCallback)  # ProgressPrinter prints one line per step instead
            trainer.train()
    report_training(trainer.state.log_history, output / "reward_curve.png", episodes_per_step=args.batch_size,
                    started=started, title=f"{Path(__file__).name}: eval score on the letters game", argv=argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
