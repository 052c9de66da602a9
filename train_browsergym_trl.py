#!/usr/bin/env python
"""Train a policy with GRPO on BrowserGym MiniWoB++ web tasks through their eval-protocol eval.

With no arguments (CPU, about 5 minutes): starts the BrowserGym server (headless Chromium), builds a tiny model
locally and warm-starts it: cloned on one demonstration per task of the action format (click or hover on each of
the page's clickable elements, or scroll the page, equally often), it writes valid actions but does not know which
one completes the task (one in three does). Then GRPO (plain SGD, see docs/browsergym.md) trains it through the
eval on two of the eval's tasks (click-test, focus-text), one action per episode, printing the eval's score per
step; at the end it prints the mean score of the first and last steps and writes a plot of the score per step
(reward_curve.png in --output-dir).

Two-GPU recipe (docs/browsergym.md):
  CUDA_VISIBLE_DEVICES=0 trl vllm-serve --model Qwen/Qwen2.5-0.5B-Instruct
  CUDA_VISIBLE_DEVICES=1 python train_browsergym_trl.py --model Qwen/Qwen2.5-0.5B-Instruct \\
      --vllm-base-url http://localhost:8000 --tasks click-test,click-button,focus-text,enter-text \\
      --max-steps 200 --num-generations 8 --batch-size 16 --env-steps 5 --max-completion-length 3072 \\
      --max-concurrent 8 --lora-r 16 --learning-rate 5e-4 --report-to trackio

One GPU (docs/vllm.md): python train_browsergym_trl.py --vllm-mode colocate --model Qwen/Qwen2.5-0.5B-Instruct ...
Rollouts overlapping training steps (docs/async.md): --async --vllm-base-url URL --model M (the server's model).
A vision-language model on the screenshots, asynchronously: --screenshots --async --vllm-base-url URL --model VLM
(a server started with --enable-scale-out; docs/browsergym.md, "Vision-language models").
"""

import argparse
import json
import os
import sys
import time
import urllib.request
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

    from peft import LoraConfig
    from trl import GRPOConfig
    from trl.experimental.async_grpo import AsyncGRPOConfig

    from ep_trl.devtools.cloning import Demonstration
    from ep_trl.devtools.training_modes import TrainingMode

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

HERE = Path(__file__).resolve().parent
DEFAULT_ENV_PATH = str(HERE / "examples" / "browsergym" / "eval_miniwob.py") + "::test_miniwob"
ENV_URL_VAR = "BROWSERGYM_ENV_URL"  # what the eval's env_factory reads
#: The eval's tasks the warm-started tiny model learns on CPU in minutes (it cannot read which button to press).
CPU_TASKS = ("click-test", "focus-text")
DEFAULT_MAX_STEPS = 15
#: The tiny model's optimizer and learning rate (measured: docs/browsergym.md, "How the tiny model learns").
TINY_OPTIM, TINY_LEARNING_RATE = "sgd", 0.05


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line flags; the defaults are the quick CPU run."""
    from ep_trl.devtools.training_modes import add_generation_flags, check_generation_flags

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env-path", default=DEFAULT_ENV_PATH, help="eval test to train on (module::test or file.py::test)")
    p.add_argument("--env-url", default=None, help="BrowserGym server URL; default: start one on a free port")
    p.add_argument("--tasks", default=",".join(CPU_TASKS),
                   help="comma-separated MiniWoB tasks, one per prompt group in turn (the eval's own four: "
                        "click-test,click-button,focus-text,enter-text)")
    p.add_argument("--env-steps", type=int, default=1, help="environment steps per episode (the eval's is 5)")
    p.add_argument("--max-concurrent", type=int, default=2,
                   help="episodes at once = browsers on the started server (2 suits 2 cores)")
    p.add_argument("--screenshots", action="store_true",
                   help="the server this script starts sends screenshots; a vision-language --model trains on them "
                        "(text-only models drop them; see docs/browsergym.md)")
    p.add_argument("--model", default=None,
                   help="model name or path; default: a tiny model built locally and warm-started (see above)")
    p.add_argument("--no-warm-start", action="store_true",
                   help="train the tiny model from its random weights (it writes no valid action: reward 0)")
    add_generation_flags(p)
    p.add_argument("--lora-r", type=int, default=0, help="LoRA rank; 0 trains all weights")
    p.add_argument("--lora-alpha", type=int, default=None, help="LoRA alpha (default 2 x rank)")
    p.add_argument("--lora-dropout", type=float, default=0.0)
    p.add_argument("--lora-target-modules", default="all-linear",
                   help="comma-separated module names, or all-linear")
    p.add_argument("--max-steps", type=int, default=DEFAULT_MAX_STEPS, help="optimizer steps")
    p.add_argument("--num-generations", type=int, default=4, help="episodes per prompt group (GRPO group size)")
    p.add_argument("--batch-size", type=int, default=8, help="episodes per optimizer step")
    p.add_argument("--learning-rate", type=float, default=None,
                   help=f"default {TINY_LEARNING_RATE} with the tiny model's --optim sgd, else 5e-4")
    p.add_argument("--optim", default=None,
                   help="transformers optimizer name; default sgd for the tiny model (Adam's per-weight normalised "
                        "steps break its action format: docs/browsergym.md), else adamw_torch")
    p.add_argument("--max-completion-length", type=int, default=640,
                   help="token budget of a whole episode: sampled turns plus the observations between them")
    p.add_argument("--max-turn-tokens", type=int, default=None, help="tokens per model turn (default: the eval's)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--output-dir", default="outputs/browsergym")
    p.add_argument("--report-to", default="none", help="none, trackio, wandb, tensorboard, ...")
    p.add_argument("--run-name", default=None)
    p.add_argument("--project", default="ep-trl-browsergym", help="trackio project (`trackio show --project NAME`)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if not [t for t in args.tasks.split(",") if t.strip()]:
        p.error("--tasks names no task; give one or more MiniWoB task names, e.g. --tasks click-test")
    tiny = args.model is None
    args.optim = args.optim or (TINY_OPTIM if tiny else "adamw_torch")
    if args.learning_rate is None:
        args.learning_rate = TINY_LEARNING_RATE if tiny and args.optim == TINY_OPTIM else 5e-4
    if args.batch_size % args.num_generations:
        p.error(f"--batch-size ({args.batch_size}) must be a multiple of --num-generations ({args.num_generations})")
    check_generation_flags(p, args)
    return args


def lora_config(args: argparse.Namespace) -> "LoraConfig | None":
    """A peft LoraConfig for ``--lora-r`` > 0, else None (full fine-tuning)."""
    if args.lora_r <= 0:
        return None
    from peft import LoraConfig

    targets = args.lora_target_modules
    return LoraConfig(
        r=args.lora_r, lora_alpha=args.lora_alpha or 2 * args.lora_r, lora_dropout=args.lora_dropout,
        target_modules=targets if targets == "all-linear" else [t.strip() for t in targets.split(",") if t.strip()],
        task_type="CAUSAL_LM",
    )


def grpo_config(args: argparse.Namespace, mode: "TrainingMode") -> "GRPOConfig | AsyncGRPOConfig":
    """The trainer's config from the flags, with the generation mode's settings (``TrainingMode.config``): on GPU
    with a vLLM server the trainer owns the client and pushes weights; an ``AsyncGRPOConfig`` with ``--async``."""
    return mode.config(
        output_dir=args.output_dir, bf16=mode.on_gpu, seed=args.seed,
        per_device_train_batch_size=args.batch_size, num_generations=args.num_generations,
        max_completion_length=args.max_completion_length, temperature=args.temperature,
        learning_rate=args.learning_rate, optim=args.optim, max_steps=args.max_steps, logging_steps=1,
        save_strategy="no",
        report_to=[] if args.report_to == "none" else [args.report_to], run_name=args.run_name,
        project=args.project,
        disable_tqdm=True,
    )


def check_tasks(env_url: str, tasks: list[str]) -> None:
    """Fail before training when a task name is unknown to the server (every episode would fail)."""
    with urllib.request.urlopen(f"{env_url}/tasks", timeout=30) as resp:  # noqa: S310 - the local env server
        known = set(json.load(resp)["tasks"])
    unknown = [t for t in tasks if t not in known]
    if unknown:
        raise SystemExit(f"unknown MiniWoB task(s) {unknown}; valid names include {sorted(known)[:12]} "
                         f"(GET {env_url}/tasks lists all {len(known)})")


def starting_policy(args: argparse.Namespace, env_url: str, tasks: list[str], output: Path
                    ) -> "tuple[str, tuple[Demonstration, ...]]":
    """The model to train (``--model``, else the tiny model, warm-started unless ``--no-warm-start``; says which) and
    the demonstrations it was cloned on (none without the warm start)."""
    if args.model:
        return args.model, ()
    from ep_trl.devtools.cloning import CloningRecipe, clone_on_demonstrations
    from ep_trl.devtools.miniwob_demonstrations import ELEMENT_ACTIONS, PAGE_ACTIONS, first_turn_demonstrations
    from ep_trl.devtools.tiny_model import build_tiny_model

    tiny = build_tiny_model(output / "tiny-model", seed=args.seed)
    if args.no_warm_start:
        print("policy: the tiny model with random weights (no warm start); it writes no valid action, so expect "
              "reward 0", flush=True)
        return str(tiny), ()
    demonstrations = first_turn_demonstrations(args.env_path, env_url, tasks, seed=args.seed)
    cloned = clone_on_demonstrations(tiny, output / "warm-start", demonstrations, CloningRecipe(seed=args.seed))
    print(f"policy: the tiny model (random weights) cloned on one demonstration per task of the action format, "
          f"{' or '.join(ELEMENT_ACTIONS)} on each clickable element or {' or '.join(PAGE_ACTIONS)}, equally often "
          f"({'cached' if cloned.cached else f'{cloned.steps} steps'}); it writes valid actions but does not know "
          f"which one completes the task.", flush=True)
    print_answers("before training", tasks, demonstrations, cloned.answer_probabilities)
    return str(cloned.path), demonstrations


def print_answers(when: str, tasks: list[str], demonstrations: "Sequence[Demonstration]",
                  probabilities: "Sequence[Sequence[float]]") -> None:
    """The policy's probability of each demonstrated first-turn answer, per task."""
    print(f"{when}, the policy's first-turn answers (probability):", flush=True)
    for task, demonstration, answer_probabilities in zip(tasks, demonstrations, probabilities):
        answers = ", ".join(f"{a} {p:.2f}" for a, p in zip(demonstration.answers, answer_probabilities))
        print(f"  {task}: {answers}", flush=True)


def main(argv: list[str] | None = None) -> int:
    """Start the environment server unless one is given, train, print a line per step; 0 on success."""
    args = parse_args(argv)
    from ep_trl.devtools.scripts import ProgressPrinter, local_env_server, report_training, script_logging

    script_logging()

    from transformers import PrinterCallback

    from ep_trl import EvalOverrides, dataset_from_eval
    from ep_trl.devtools.training_modes import TrainingMode

    started = time.monotonic()
    mode = TrainingMode.from_args(args)
    print(mode.describe(), flush=True)
    output = Path(args.output_dir)
    config = grpo_config(args, mode)
    groups_per_step = args.batch_size // args.num_generations
    dataset = dataset_from_eval(args.env_path, repeat=groups_per_step * args.max_steps)
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    peft_config = lora_config(args)
    server_env = {"BROWSERGYM_MAX_SESSIONS": str(args.max_concurrent)}
    if args.screenshots:
        server_env["BROWSERGYM_SCREENSHOT"] = "1"

    server = local_env_server("ep_trl.envs.browsergym", env=server_env) if args.env_url is None \
        else nullcontext(args.env_url)
    with server as env_url:
        print(f"environment server: {env_url}", flush=True)
        os.environ[ENV_URL_VAR] = env_url
        check_tasks(env_url, tasks)
        model, demonstrations = starting_policy(args, env_url, tasks, output)
        with mode.trainer(args.env_path, model=model, args=config, train_dataset=dataset,
                          callbacks=[ProgressPrinter()], peft_config=peft_config, images=args.screenshots,
                          overrides=EvalOverrides(max_steps=args.env_steps, max_tokens=args.max_turn_tokens,
                                                  tasks=tasks),
                          max_concurrent_rollouts=args.max_concurrent) as trainer:
            trainer.remove_callback(PrinterCallback)  # ProgressPrinter prints one line per step instead
            if peft_config is not None:
                trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
                total = sum(p.numel() for p in trainer.model.parameters())
                print(f"LoRA r={peft_config.r} alpha={peft_config.lora_alpha}: "
                      f"{trainable} of {total} parameters trainable", flush=True)
            trainer.train()
    if demonstrations:
        from ep_trl.devtools.cloning import answer_probabilities

        print_answers("after training", tasks, demonstrations,
                      answer_probabilities(trainer.model, trainer.processing_class, demonstrations))
    report_training(trainer.state.log_history, output / "reward_curve.png", episodes_per_step=args.batch_size,
                    started=started, title=f"{Path(__file__).name}: eval score on {', '.join(tasks)}", argv=argv)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # the environment server was already stopped on the way out
        print("interrupted: environment server stopped", flush=True)
        sys.exit(130)
