"""A training process for tests to kill in the middle of a rollout call (tests/runtime/test_shutdown.py).

    python -m tests.support.killable_training ENV_PATH MODEL_DIR OUTPUT_DIR

Trains ENV_PATH through ``env_path`` alone with a real ``GRPOTrainer.train()``. Generation goes to a fault-injection
server that never answers (``tests/support/faulty_vllm.py``, ``"hang"``), so from the first rollout call on the
process is inside that call, with the eval's environment servers (started by ep_trl for a Docker-image eval), its
stdio MCP servers or its MCP-gym server (started by the eval's processor) up, whenever the test kills it. Prints
``TRAINING`` just before ``train()``.
"""

import sys
from pathlib import Path

from ep_trl import VLLMOptions, create_openenv_vllm_rollout_func, dataset_from_eval
from tests.support.faulty_vllm import FaultyVLLMServer
from tests.support.trainers import make_trainer


def main(env_path: str, model_dir: str, output_dir: str) -> None:
    with FaultyVLLMServer(default="hang") as server:
        rollout = create_openenv_vllm_rollout_func(
            env_path,
            vllm_base_url=server.url,
            log_rollouts=False,
            vllm=VLLMOptions(request_timeout_s=600, max_retries=0),
        )
        prompts = list(dataset_from_eval(env_path)["prompt"]) * 4
        trainer = make_trainer(
            Path(model_dir),
            Path(output_dir),
            rollout,
            num_generations=2,
            batch_size=2,
            max_steps=5,
            max_completion_length=64,
            prompts=prompts,
        )
        print("TRAINING", flush=True)
        trainer.train()


if __name__ == "__main__":
    main(*sys.argv[1:])
