"""A vision-language model trained on the BrowserGym eval's screenshots, through ``env_path`` alone.

The project's BrowserGym server sends screenshots (``BROWSERGYM_SCREENSHOT=1``), the eval's prompt builder puts
them in image parts, and the tiny Idefics3 model samples with the pixels (in-process backend) and trains on them
(``RolloutImagesGRPOTrainer``). Checked: every observation's screenshot is in the sample, its tokens masked; the
sampled logprobs equal teacher-forced ones computed WITH the pixels and differ from text-only ones; changing one
screenshot changes the logprobs; TRL's own ``sampling/sampling_logp_difference`` stays ~0 over real ``train()``
steps. Costs: 8 episodes of 2 steps on one MiniWoB task.
"""

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from PIL import ImageOps
from trl import GRPOTrainer

from ep_trl import ConfigError, EvalOverrides, create_openenv_vllm_rollout_func, dataset_from_eval
from ep_trl.devtools.tiny_vlm import IMAGE, IMAGE_SEQ_LEN
from ep_trl.rewards import eval_score
from ep_trl.runtime.processes import ServerProcess
from ep_trl.trainers.images import RolloutImagesGRPOTrainer
from tests.support.browsergym import browsergym_server
from tests.support.images import token_logprobs
from tests.support.vlm_trainers import logged, make_vlm_trainer

if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

ROOT = Path(__file__).resolve().parents[2]
ENV_PATH = f"{ROOT / 'evals' / 'eval_miniwob.py'}::test_miniwob"


@pytest.fixture(scope="module")
def screenshot_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A BrowserGym server that sends screenshots, exported as BROWSERGYM_ENV_URL."""
    with browsergym_server(tmp_path_factory.mktemp("browsergym-logs"), env={"BROWSERGYM_SCREENSHOT": "1"}) as server:
        yield server


def sampled_positions(out: "Mapping[str, list[Any]]", i: int) -> list[int]:
    """Indices into prompt + completion of sample ``i``'s sampled tokens."""
    n = len(out["prompt_ids"][i])
    return [n + k for k, m in enumerate(out["env_mask"][i]) if m == 1]


@pytest.mark.slow
def test_screenshots_reach_sampling_and_the_loss(
    screenshot_server: ServerProcess, tiny_vlm_dir: Path, tmp_path: Path
) -> None:
    rollout = create_openenv_vllm_rollout_func(
        ENV_PATH, backend="trainer", log_rollouts=False, overrides=EvalOverrides(max_steps=2, tasks=["click-test"])
    )
    prompts = list(dataset_from_eval(ENV_PATH, repeat=2)["prompt"])
    trainer = make_vlm_trainer(
        RolloutImagesGRPOTrainer,
        tiny_vlm_dir,
        tmp_path,
        rollout,
        prompts * 4,
        reward_funcs=[eval_score],
        max_steps=2,
        max_completion_length=1024,
    )
    processor = trainer.processing_class
    model = trainer.model.eval()
    image = processor.tokenizer.convert_tokens_to_ids(IMAGE)
    gaps = {"with pixels": 0.0, "text only": float("inf"), "screenshot changed": 0.0}
    try:
        out = rollout(prompts, trainer)  # before any update: the model that sampled is the one scored below
        assert out["episode_status"] == ["finished", "finished"] and out["num_turns"] == [2, 2]
        for i in range(2):
            images, ids = out["images"][i], out["prompt_ids"][i] + out["completion_ids"][i]
            assert len(images) == 2  # one screenshot per observation, prompt then bridge
            assert out["prompt_ids"][i].count(image) == IMAGE_SEQ_LEN
            assert [m for t, m in zip(out["completion_ids"][i], out["env_mask"][i]) if t == image] == [
                0
            ] * IMAGE_SEQ_LEN
            at = sampled_positions(out, i)
            sampled = [out["logprobs"][i][p - len(out["prompt_ids"][i])] for p in at]
            with_pixels = token_logprobs(model, processor, ids, images)
            without = token_logprobs(model, processor, ids, images, pixels=False)
            gaps["with pixels"] = max(gaps["with pixels"], *(abs(with_pixels[p - 1] - s) for p, s in zip(at, sampled)))
            gaps["text only"] = min(gaps["text only"], max(abs(without[p - 1] - s) for p, s in zip(at, sampled)))
        assert gaps["with pixels"] < 1e-3
        assert gaps["text only"] > 0.1  # the pixels mattered: scored without them, every sample moves
        # another screenshot at the second observation: the second turn's logprobs move
        changed = [out["images"][0][0], ImageOps.invert(out["images"][0][1].convert("RGB"))]
        ids = out["prompt_ids"][0] + out["completion_ids"][0]
        second_turn = [p for p in sampled_positions(out, 0) if p > ids.index(image, len(out["prompt_ids"][0]))]
        before, after = (
            token_logprobs(model, processor, ids, out["images"][0]),
            token_logprobs(model, processor, ids, changed),
        )
        gaps["screenshot changed"] = max(abs(before[p - 1] - after[p - 1]) for p in second_turn)
        assert gaps["screenshot changed"] > 1e-3
        model.train()
        trainer.train()
    finally:
        rollout.close()
    difference = logged(trainer, "sampling/sampling_logp_difference/max")
    print(f"max |sampled - teacher-forced| logprob: {gaps}; TRL sampling_logp_difference/max per step: {difference}")
    assert len(difference) == 2 and max(difference) < 1e-3, difference


@pytest.mark.slow
def test_plain_grpo_trainer_is_refused_rather_than_trained_without_the_pixels(
    screenshot_server: ServerProcess, tiny_vlm_dir: Path, tmp_path: Path
) -> None:
    rollout = create_openenv_vllm_rollout_func(
        ENV_PATH, backend="trainer", log_rollouts=False, overrides=EvalOverrides(max_steps=1, tasks=["click-test"])
    )
    prompts = list(dataset_from_eval(ENV_PATH, repeat=2)["prompt"])
    trainer = make_vlm_trainer(GRPOTrainer, tiny_vlm_dir, tmp_path, rollout, prompts, reward_funcs=[eval_score])
    try:
        with pytest.raises(ConfigError, match="RolloutImagesGRPOTrainer"):
            rollout(prompts, trainer)
    finally:
        rollout.close()
