#!/usr/bin/env python
"""Train a policy with GRPO on BrowserGym MiniWoB++ web tasks through their eval-protocol eval.

With no arguments (CPU): starts the BrowserGym server (headless Chromium), builds a tiny model
locally and warm-starts it: cloned on one demonstration per task of the action format (click or hover on each of
the page's clickable elements, or scroll the page, equally often), it writes valid actions but does not know which
one completes the task (one in three does). Then GRPO (plain SGD, see docs/browsergym.md) trains it through the
eval on two of the eval's tasks (click-test, focus-text), one action per episode, printing the eval's score per
step; at the end it prints the mean score of the first and last steps and writes a plot of the score per step
(reward_curve.png in --output-dir).

A preset of `ep-trl train` (docs/cli.md): this script fills its defaults and calls it, so the run writes the same
run folder (config.yaml, metrics.jsonl, reward_curve.png, result.json, checkpoint/).

Two-GPU recipe (docs/setup.md):
  CUDA_VISIBLE_DEVICES=0 trl vllm-serve --model Qwen/Qwen2.5-0.5B-Instruct
  CUDA_VISIBLE_DEVICES=1 python train_browsergym_trl.py --model Qwen/Qwen2.5-0.5B-Instruct \\
      --vllm-server-url http://localhost:8000 --tasks click-test,click-button,focus-text,enter-text \\
      --max-steps 200 --num-generations 8 --batch-size 16 --env-steps 5 --max-completion-length 3072 \\
      --max-concurrent 8 --lora-r 16 --learning-rate 5e-4 --report-to trackio

One GPU (docs/vllm.md): python train_browsergym_trl.py --vllm-mode colocate --model Qwen/Qwen2.5-0.5B-Instruct ...
Rollouts overlapping training steps (docs/async.md): --async --vllm-server-url URL --model M (the server's model).
A vision-language model on the screenshots, asynchronously: --screenshots --async --vllm-server-url URL --model VLM
(a server started with --enable-scale-out; docs/browsergym.md, "Vision-language models").
"""

import argparse
import json
import os
import sys
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ep_trl.devtools.cloning import Demonstration

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

HERE = Path(__file__).resolve().parent
DEFAULT_ENV_PATH = str(HERE / "evals" / "eval_miniwob.py") + "::test_miniwob"
ENV_URL_VAR = "BROWSERGYM_ENV_URL"  # what the eval's env_factory reads
#: The eval's tasks the warm-started tiny model learns on CPU in minutes (it cannot read which button to press).
CPU_TASKS = ("click-test", "focus-text")
DEFAULT_MAX_STEPS = 15
#: The tiny model's optimizer and learning rate (measured: docs/browsergym.md, "How the tiny model learns").
TINY_OPTIM, TINY_LEARNING_RATE = "sgd", 0.05


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line flags; the defaults are the quick CPU run."""
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
            env_path=DEFAULT_ENV_PATH,
            model="a tiny model built locally and warm-started (see above)",
            output_dir="outputs/browsergym",
            max_steps=DEFAULT_MAX_STEPS,
            num_generations=4,
            batch_size=8,
            learning_rate=None,
            max_completion_length=640,
            helps={"learning_rate": f"default {TINY_LEARNING_RATE} with the tiny model's --optim sgd, else 5e-4"},
        ),
    )
    p.add_argument("--env-url", default=None, help="BrowserGym server URL; default: start one on a free port")
    p.add_argument(
        "--tasks",
        default=",".join(CPU_TASKS),
        help="comma-separated MiniWoB tasks, one per prompt group in turn (the eval's own four: "
        "click-test,click-button,focus-text,enter-text)",
    )
    p.add_argument("--env-steps", type=int, default=1, help="environment steps per episode (the eval's is 5)")
    p.add_argument(
        "--max-concurrent",
        type=int,
        default=2,
        help="episodes at once = browsers on the started server (2 suits 2 cores)",
    )
    p.add_argument(
        "--screenshots",
        action="store_true",
        help="the server this script starts sends screenshots; a vision-language --model trains on them "
        "(text-only models drop them; see docs/browsergym.md)",
    )
    p.add_argument(
        "--no-warm-start",
        action="store_true",
        help="train the tiny model from its random weights (it writes no valid action: reward 0)",
    )
    add_generation_flags(p)
    p.add_argument("--lora-r", type=int, default=0, help="LoRA rank; 0 trains all weights")
    p.add_argument("--lora-alpha", type=int, default=None, help="LoRA alpha (default 2 x rank)")
    p.add_argument("--lora-dropout", type=float, default=0.0)
    p.add_argument("--lora-target-modules", default="all-linear", help="comma-separated module names, or all-linear")
    p.add_argument(
        "--optim",
        default=None,
        help="transformers optimizer name; default sgd for the tiny model (Adam's per-weight normalised "
        "steps break its action format: docs/browsergym.md), else adamw_torch",
    )
    p.add_argument("--max-turn-tokens", type=int, default=None, help="tokens per model turn (default: the eval's)")
    p.add_argument("--report-to", default="none", help="none, trackio, wandb, tensorboard, ...")
    p.add_argument("--run-name", default=None)
    p.add_argument("--project", default="ep-trl-browsergym", help="trackio project (`trackio show --project NAME`)")
    args = p.parse_args(argv)
    if not [t for t in args.tasks.split(",") if t.strip()]:
        p.error("--tasks names no task; give one or more MiniWoB task names, e.g. --tasks click-test")
    tiny = args.model is None
    args.optim = args.optim or (TINY_OPTIM if tiny else "adamw_torch")
    if args.learning_rate is None:
        args.learning_rate = TINY_LEARNING_RATE if tiny and args.optim == TINY_OPTIM else 5e-4
    check_training_flags(p, args)
    check_generation_flags(p, args)
    return args


def check_tasks(env_url: str, tasks: list[str]) -> None:
    """Fail before training when a task name is unknown to the server (every episode would fail)."""
    with urllib.request.urlopen(f"{env_url}/tasks", timeout=30) as resp:  # noqa: S310 - the local env server
        known = set(json.load(resp)["tasks"])
    unknown = [t for t in tasks if t not in known]
    if unknown:
        raise SystemExit(
            f"unknown MiniWoB task(s) {unknown}; valid names include {sorted(known)[:12]} "
            f"(GET {env_url}/tasks lists all {len(known)})"
        )


def starting_policy(
    args: argparse.Namespace, env_url: str, tasks: list[str], output: Path
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
        print(
            "policy: the tiny model with random weights (no warm start); it writes no valid action, so expect reward 0",
            flush=True,
        )
        return str(tiny), ()
    demonstrations = first_turn_demonstrations(args.env_path, env_url, tasks, seed=args.seed)
    cloned = clone_on_demonstrations(tiny, output / "warm-start", demonstrations, CloningRecipe(seed=args.seed))
    print(
        f"policy: the tiny model (random weights) cloned on one demonstration per task of the action format, "
        f"{' or '.join(ELEMENT_ACTIONS)} on each clickable element or {' or '.join(PAGE_ACTIONS)}, equally often "
        f"({'cached' if cloned.cached else f'{cloned.steps} steps'}); it writes valid actions but does not know "
        f"which one completes the task.",
        flush=True,
    )
    print_answers("before training", tasks, demonstrations, cloned.answer_probabilities)
    return str(cloned.path), demonstrations


def print_answers(
    when: str, tasks: list[str], demonstrations: "Sequence[Demonstration]", probabilities: "Sequence[Sequence[float]]"
) -> None:
    """The policy's probability of each demonstrated first-turn answer, per task."""
    print(f"{when}, the policy's first-turn answers (probability):", flush=True)
    for task, demonstration, answer_probabilities in zip(tasks, demonstrations, probabilities):
        answers = ", ".join(f"{a} {p:.2f}" for a, p in zip(demonstration.answers, answer_probabilities))
        print(f"  {task}: {answers}", flush=True)


def main(argv: list[str] | None = None) -> int:
    """``ep-trl train`` with this script's defaults: the BrowserGym server started for the run (unless --env-url),
    its task names checked there, the tiny model warm-started unless --model; 0 on success."""
    args = parse_args(argv)
    from ep_trl.cli import Preset, env_server_defaults, recipe_command, recipe_name, run_preset

    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    demonstrations: list = []

    def start_model(env_url: str, model: str | None) -> str:
        check_tasks(env_url, tasks)
        policy, shown = starting_policy(args, env_url, tasks, Path(args.output_dir))
        demonstrations.extend(shown)
        return policy

    def after_training(trainer) -> None:
        if demonstrations:
            from ep_trl.devtools.cloning import answer_probabilities

            print_answers(
                "after training",
                tasks,
                demonstrations,
                answer_probabilities(trainer.model, trainer.processing_class, demonstrations),
            )

    server_env = {"BROWSERGYM_MAX_SESSIONS": str(args.max_concurrent)}
    if args.screenshots:
        server_env["BROWSERGYM_SCREENSHOT"] = "1"
    defaults = env_server_defaults(
        args,
        "ep_trl.envs.browsergym",
        ENV_URL_VAR,
        tasks=tasks,
        env_steps=args.env_steps,
        max_turn_tokens=args.max_turn_tokens,
        max_concurrent_rollouts=args.max_concurrent,
        screenshots=args.screenshots,
        lora_r=args.lora_r,
        lora_alpha=args.lora_alpha,
        lora_dropout=args.lora_dropout,
        lora_target_modules=args.lora_target_modules,
        run_name=args.run_name,
        project=args.project,
    )
    return run_preset(
        Preset(
            prog=recipe_name(__file__),
            title=f"{recipe_name(__file__)}: eval score on {', '.join(tasks)}",
            defaults=defaults,
            start_model=start_model,
            after_training=after_training,
            env_server_env=server_env,
            command=recipe_command(__file__, argv),
        )
    )


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # the run printed "interrupted: environment server stopped ..." on its way out
        sys.exit(130)
