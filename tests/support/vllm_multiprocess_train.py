"""Two-process GRPO training through one vLLM server, run by tests/generation/test_vllm_real.py under ``torchrun``.

    torchrun --nproc_per_node 2 -m tests.support.vllm_multiprocess_train \
        --server URL --letters URL --model DIR --out DIR [--steps 2]

Each process gets its own slice of the prompts (one GRPO group per process per step) and runs the bridge on it;
the main process pushes weights to the server (DiskSyncGRPOTrainer, the CPU stand-in for TRL's NCCL sync)
before each step's rollouts. Every process writes ``<out>/rank<k>.jsonl``: one line per reward call with the
prompts it saw, the task each episode played (read from the environment text in the completion), statuses and
scores. The main process also writes ``<out>/log_history.json`` (TRL's logged metrics).
"""

import argparse
import json
import os
from pathlib import Path
from typing import Any

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True)
    parser.add_argument("--letters", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=2)
    cli = parser.parse_args()
    os.environ["LETTERS_ENV_URL"] = cli.letters

    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig

    from ep_trl import create_openenv_vllm_rollout_func
    from ep_trl.trainers.disk_sync import DiskSyncGRPOTrainer

    out = Path(cli.out)
    out.mkdir(parents=True, exist_ok=True)
    rank = int(os.environ.get("RANK", "0"))
    calls = {"n": 0}

    def recording_reward(
        prompts: list[Any], completions: list[Any], eval_score: list[Any], episode_status: list[str], **_: Any
    ) -> list[Any]:
        """Returns the eval's score; records what this process saw."""
        calls["n"] += 1
        tasks = ["digits" if "0123456789" in str(c) else "vowels" if "aeiou" in str(c) else "?" for c in completions]
        line = {"call": calls["n"], "prompts": prompts, "tasks": tasks, "status": episode_status, "scores": eval_score}
        with open(out / f"rank{rank}.jsonl", "a") as f:
            f.write(json.dumps(line) + "\n")
        return eval_score

    rollout = create_openenv_vllm_rollout_func("tests.evals.eval_letters::test_letters_pointwise", log_rollouts=False)
    args = GRPOConfig(
        output_dir=str(out / "trainer"),
        use_cpu=True,
        bf16=False,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=256,
        max_steps=cli.steps,
        logging_steps=1,
        report_to=[],
        learning_rate=1e-3,
        save_strategy="no",
        seed=0,
        temperature=0.8,
        use_vllm=True,
        vllm_mode="server",
        vllm_server_base_url=cli.server,
        ddp_backend="gloo",
    )
    prompts = [f"Play the letters game, round {i}." for i in range(16)]
    trainer = DiskSyncGRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(cli.model),
        reward_funcs=[recording_reward],
        args=args,
        train_dataset=Dataset.from_dict({"prompt": prompts}),
        processing_class=AutoTokenizer.from_pretrained(cli.model),
        rollout_func=rollout,
    )
    try:
        trainer.train()
    finally:
        rollout.close()
    if trainer.accelerator.is_main_process:
        (out / "log_history.json").write_text(json.dumps(trainer.state.log_history))
        (out / "pushes.json").write_text(json.dumps({"pushes": trainer.weight_sync.pushes}))


if __name__ == "__main__":
    main()
