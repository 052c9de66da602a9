"""The real pretrained model (SmolLM2-135M-Instruct, ``ep_trl.devtools.real_model``) through TRL's colocated vLLM
engine (``CPUColocateGRPOTrainer`` on CPU): token-exact on its own tokenizer and chat template on the multi-turn
letters eval, as ``tests/project/test_smollm2.py`` checks the server, the trainer backend and the async worker."""

from typing import TYPE_CHECKING, cast

import pytest
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig

from ep_trl import create_rollout_func
from ep_trl.adapters.rollout_func import RolloutFunction
from ep_trl.devtools.real_model import build_smollm2
from ep_trl.rewards import eval_score
from ep_trl.trainers.cpu_colocate import CPUColocateGRPOTrainer
from tests.support.real_model import TEMPERATURE, check_rollout_output
from tests.support.trainers import PROMPT

if TYPE_CHECKING:
    from pathlib import Path

    from transformers import PreTrainedTokenizerBase

    from tests.support.letters import LettersEpisodes

LETTERS = "tests.evals.eval_letters::test_letters_pointwise"


@pytest.mark.timeout(900)
def test_the_colocated_engine_is_token_exact_on_the_real_model(
    letters_server: str, letters_episodes: "LettersEpisodes", tmp_path: "Path"
) -> None:
    model_dir = build_smollm2()  # built by scripts/install.sh in the project's Python; this venv reads the cache
    args = GRPOConfig(
        output_dir=str(tmp_path),
        use_cpu=True,
        bf16=False,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=256,
        max_steps=1,
        report_to=[],
        save_strategy="no",
        temperature=TEMPERATURE,
        use_vllm=True,
        vllm_mode="colocate",
        vllm_max_model_length=1024,
    )
    rollout = create_rollout_func(LETTERS, log_rollouts=False)
    trainer = CPUColocateGRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(model_dir),
        reward_funcs=[eval_score],
        args=args,
        train_dataset=Dataset.from_dict({"prompt": [PROMPT] * 4}),
        processing_class=AutoTokenizer.from_pretrained(model_dir),
        rollout_func=rollout,
    )
    try:
        out = rollout([PROMPT] * 4, trainer)
        assert isinstance(rollout, RolloutFunction) and rollout.backend_name == "vllm-colocate"
    finally:
        rollout.close()
    assert trainer.model is not None
    check_rollout_output(
        trainer.model.eval(), cast("PreTrainedTokenizerBase", trainer.processing_class), out, letters_episodes()
    )
