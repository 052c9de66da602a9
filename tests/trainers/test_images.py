"""The TRL seam for images (ep_trl.trainers.images), pinned against the installed TRL.

A rollout function samples turns with screenshots in-process and returns them under ``images``. TRL's own check,
``sampling/sampling_logp_difference`` (its recomputed logprobs against the sampled ones), is ~0 only when the
trainer's forward passes see the pixels: with ``RolloutImagesGRPOTrainer`` it is; with plain ``GRPOTrainer`` it is
not, because TRL 1.16 drops images returned by ``rollout_func``. When that second test fails, TRL has grown the
feature and ``ep_trl.trainers.images`` should go.
"""

import asyncio
import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pytest
from trl import GRPOTrainer

from ep_trl.generation import PromptImages, SamplingParams
from ep_trl.generation.trainer import TrainerGenerator
from ep_trl.trainers.images import RolloutImagesGRPOTrainer
from ep_trl.trajectory.template import ChatTemplate
from tests.support.images import png_data_uri, user_with_image
from tests.support.vlm_trainers import logged, make_vlm_trainer

if TYPE_CHECKING:
    from transformers import ProcessorMixin

    from ep_trl.generation import Generation

COLORS = [(255, 0, 0), (0, 160, 0), (0, 0, 255), (200, 200, 0)]


def screenshot_rollout(prompts: list[str], trainer: GRPOTrainer) -> dict[str, list[Any]]:
    """One sampled turn per prompt, its prompt holding a screenshot; rewarded by length, to give GRPO a signal."""
    processor = cast("ProcessorMixin", trainer.processing_class)  # the tiny VLM's
    template = ChatTemplate(processor)
    tok = processor.tokenizer
    model = trainer.accelerator.unwrap_model(trainer.model)
    generator = TrainerGenerator(lambda: model, tok, [tok.eos_token_id], tok.pad_token_id, processing_class=processor)
    encoded = [
        template.prompt([user_with_image(p, png_data_uri(COLORS[i % len(COLORS)]))]) for i, p in enumerate(prompts)
    ]

    async def sample() -> "list[Generation]":
        try:
            return await asyncio.gather(
                *(
                    generator.generate(
                        e.ids, SamplingParams(max_tokens=8), images=PromptImages(e.images, e.unexpanded_ids)
                    )
                    for e in encoded
                )
            )
        finally:
            await generator.aclose()

    turns = asyncio.run(sample())
    return {
        "prompt_ids": [list(e.ids) for e in encoded],
        "completion_ids": [list(t.token_ids) for t in turns],
        "logprobs": [list(t.logprobs) for t in turns],
        "env_mask": [[1] * len(t.token_ids) for t in turns],
        "images": [list(e.images) for e in encoded],
        "turn_length": [len(t.token_ids) for t in turns],
    }


def length_reward(completions: list[Any], turn_length: list[int], **kwargs: object) -> list[float]:
    return [float(n) for n in turn_length]


def train_one_step(trainer_cls: type[GRPOTrainer], tiny_vlm_dir: Path, tmp_path: Path) -> GRPOTrainer:
    trainer = make_vlm_trainer(
        trainer_cls,
        tiny_vlm_dir,
        tmp_path,
        screenshot_rollout,
        ["Click the button.", "Type the word."] * 2,
        reward_funcs=[length_reward],
    )
    trainer.train()
    print(
        f"{trainer_cls.__name__}: sampling_logp_difference/max "
        f"{logged(trainer, 'sampling/sampling_logp_difference/max')}"
    )
    return trainer


def test_seam_puts_the_rollouts_images_into_every_forward(
    tiny_vlm_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    forwards: list[object] = []
    trl_forward = GRPOTrainer._get_per_token_logps_and_entropies

    @functools.wraps(trl_forward)
    def recording(
        self: GRPOTrainer, *args: Any, **kwargs: Any
    ) -> Any:  # what reaches TRL's own forward, under the seam
        forwards.append(kwargs.get("pixel_values"))
        return trl_forward(self, *args, **kwargs)

    monkeypatch.setattr(GRPOTrainer, "_get_per_token_logps_and_entropies", recording)
    trainer = train_one_step(RolloutImagesGRPOTrainer, tiny_vlm_dir, tmp_path)
    difference = logged(trainer, "sampling/sampling_logp_difference/max")
    assert len(difference) == 1 and difference[0] < 1e-3  # TRL's recomputed logprobs match the sampled ones
    assert len(forwards) >= 2 and all(p is not None for p in forwards)  # old logprobs and the loss: all with pixels
    assert "images" not in trainer._logs["extra"]


def test_plain_grpo_trainer_still_drops_rollout_images(tiny_vlm_dir: Path, tmp_path: Path) -> None:
    """Pins TRL 1.16's behaviour the seam exists for: without it the pixels are missing from the recomputed
    logprobs. If this fails, TRL takes images from rollout_func now: remove ep_trl.trainers.images."""
    trainer = train_one_step(GRPOTrainer, tiny_vlm_dir, tmp_path)
    difference = logged(trainer, "sampling/sampling_logp_difference/max")
    assert len(difference) == 1 and difference[0] > 0.1


def test_seam_refuses_images_that_do_not_match_the_samples(tiny_vlm_dir: Path, tmp_path: Path) -> None:
    def one_image_list_too_few(prompts: list[str], trainer: GRPOTrainer) -> dict[str, list[Any]]:
        out = screenshot_rollout(prompts, trainer)
        return {**out, "images": out["images"][1:]}

    trainer = make_vlm_trainer(
        RolloutImagesGRPOTrainer,
        tiny_vlm_dir,
        tmp_path,
        one_image_list_too_few,
        ["Click.", "Type."],
        reward_funcs=[length_reward],
    )
    with pytest.raises(ValueError, match="one list of images per sample"):
        trainer.train()
