"""Real TRL trainers on the tiny vision-language model, with TRL's importance-sampling check switched on.

TRL computes ``sampling/sampling_logp_difference`` (its recomputed logprobs against the ones the rollout returned)
only with ``use_vllm=True``. Here the rollouts sample in-process from the trainer's own model, so there is nothing to
sync: the trainer is built as ``use_vllm=True`` without TRL's vLLM client, and a stand-in with a no-op
``sync_weights`` takes its place (the same two steps ``DiskSyncGRPOTrainer`` takes for a real server). The rollout
function must then be told to generate in-process (``backend="trainer"``).
"""

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from datasets import Dataset
from transformers import AutoModelForImageTextToText, AutoProcessor
from trl import GRPOConfig

from ep_trl.trainers.disk_sync import attach_vllm_generation, trl_vllm_client_skipped
from tests.support.device import trainer_on_cpu


class InProcessGeneration:
    """Stands in for TRL's ``VLLMGeneration``: the rollout samples from ``trainer.model``, always current."""

    vllm_client = SimpleNamespace(base_url="in-process")

    def sync_weights(self) -> None:
        """Nothing to push: generation uses the trainer's own weights."""


def make_vlm_trainer(
    trainer_cls: type,
    model_dir: Path,
    output_dir: Path,
    rollout_func: Any,
    prompts: list[Any],
    *,
    reward_funcs: list,
    num_generations: int = 2,
    batch_size: int = 2,
    max_steps: int = 1,
    max_completion_length: int = 1024,
    **config: Any,
) -> Any:
    """A CPU ``trainer_cls`` (a GRPOTrainer) on the VLM in ``model_dir`` that checks sampled against recomputed
    logprobs at every step."""
    args = GRPOConfig(
        output_dir=str(output_dir),
        use_cpu=trainer_on_cpu(),
        bf16=False,
        per_device_train_batch_size=batch_size,
        num_generations=num_generations,
        max_completion_length=max_completion_length,
        max_steps=max_steps,
        logging_steps=1,
        report_to=[],
        learning_rate=1e-3,
        save_strategy="no",
        seed=0,
        use_vllm=True,
        vllm_mode="server",
        **config,
    )
    with trl_vllm_client_skipped(args):
        trainer = trainer_cls(
            model=AutoModelForImageTextToText.from_pretrained(model_dir),
            processing_class=AutoProcessor.from_pretrained(model_dir),
            reward_funcs=reward_funcs,
            args=args,
            train_dataset=Dataset.from_dict({"prompt": prompts}),
            rollout_func=rollout_func,
        )
    attach_vllm_generation(trainer, InProcessGeneration())
    return trainer


def logged(trainer: Any, key: str) -> list[float]:
    """A metric's values, one per logged step."""
    return [entry[key] for entry in trainer.state.log_history if key in entry]
