"""Real GRPOTrainer instances on the tiny model, for driving rollout functions as TRL does."""

import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from datasets import Dataset
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    TrainerCallback,
    TrainerControl,
    TrainerState,
    TrainingArguments,
)
from trl import GRPOConfig, GRPOTrainer

from ep_trl.rewards import eval_score
from tests.support.device import trainer_on_cpu

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel

PROMPT = "Play the letters game."


def make_trainer(
    model_dir: Path,
    output_dir: Path,
    rollout_func: Any,
    *,
    reward_funcs: list | None = None,
    num_generations: int = 4,
    batch_size: int = 4,
    max_completion_length: int = 256,
    max_steps: int = 2,
    prompts: list[Any] | None = None,
    **config: Any,
) -> GRPOTrainer:
    """A CPU GRPOTrainer whose generation goes through ``rollout_func``."""
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    dataset = Dataset.from_dict({"prompt": prompts or [PROMPT] * 8})
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
        **config,
    )
    return GRPOTrainer(
        model=model,
        processing_class=tokenizer,
        reward_funcs=reward_funcs or [eval_score],
        args=args,
        train_dataset=dataset,
        rollout_func=rollout_func,
    )


class WeightSnapshots(TrainerCallback):
    """Keeps a copy of the weights after every optimizer step (``states[step]``)."""

    def __init__(self) -> None:
        self.states: dict[int, dict[str, torch.Tensor]] = {}

    def on_step_end(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        model: "PreTrainedModel | None" = None,
        **kwargs: Any,
    ) -> None:
        assert model is not None
        self.states[state.global_step] = {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_trained(trainer: Any) -> None:
    """Some step of ``trainer`` had a gradient, and none a NaN or infinite one. GRPO's advantage is a sample's reward
    against its group's: a reward that is the same for every sample of a group gives a loss and a grad_norm of 0,
    and nothing is trained; a NaN one means the weights are NaN from that step on."""
    _assert_gradients([float(entry["grad_norm"]) for entry in trainer.state.log_history if "grad_norm" in entry])


def assert_script_trained(stdout: str) -> None:
    """The step lines a training script printed (``ProgressPrinter``) pass ``assert_trained``'s check."""
    norms = [
        float(n) for n in re.findall(r"^step \d+/\d+ \|.*\| grad_norm ([0-9.e+-]+|nan|-?inf) \|", stdout, flags=re.M)
    ]
    _assert_gradients(norms, stdout[-3000:])


def _assert_gradients(norms: list[float], output: str = "") -> None:
    assert all(math.isfinite(n) for n in norms), f"a step's grad_norm is not finite (per step: {norms})\n{output}"
    assert norms and max(norms) > 0, f"no step had a gradient (grad_norm per step: {norms})\n{output}"
