"""Real GRPOTrainer.train() steps on CPU with the rollout function in the loop."""

from typing import TYPE_CHECKING

import torch

from ep_trl import create_openenv_vllm_rollout_func
from ep_trl.rewards import eval_score, step_reward_sum
from tests.support.trainers import assert_trained, make_trainer

if TYPE_CHECKING:
    from pathlib import Path

    from tests.support.letters import LettersEpisodes


def test_grpo_trains_two_steps_through_the_eval(
    tiny_model_dir: "Path", letters_server: str, letters_episodes: "LettersEpisodes", tmp_path: "Path"
) -> None:
    rollout = create_openenv_vllm_rollout_func("tests.evals.eval_letters::test_letters_pointwise")
    trainer = make_trainer(
        tiny_model_dir,
        tmp_path,
        rollout,
        reward_funcs=[eval_score, step_reward_sum],
        max_steps=2,
        num_generations=4,
        batch_size=4,
    )
    assert trainer.model is not None
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    try:
        result = trainer.train()
    finally:
        rollout.close()
    assert trainer.state.global_step == 2 and result.global_step == 2
    logs = [entry for entry in trainer.state.log_history if "reward" in entry]
    assert len(logs) == 2
    for entry in logs:
        assert 0.0 <= entry["rewards/eval_score/mean"] <= 1.0
        assert entry["ep_trl/failed_fraction"] == 0.0
        assert entry["ep_trl/mean_turns"] == 3.0
        # TRL counts only env_mask=1 tokens as completion length: at most 3 turns x 12 tokens
        assert 0 < entry["completions/mean_length"] <= 36
    assert len(letters_episodes()) == 8  # 2 steps x 4 rollouts reached the environment
    changed = [n for n, p in trainer.model.named_parameters() if not torch.equal(p, before[n])]
    assert changed, "no parameter changed after two GRPO steps"
    assert_trained(trainer)
