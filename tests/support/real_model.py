"""Checks of rollouts of the real pretrained model (SmolLM2-135M-Instruct) shared by the project's Python
(``tests/project/test_smollm2.py``) and the colocated engine's venv (``tests/colocate/test_real_model_colocate.py``)."""

from collections import Counter
from typing import TYPE_CHECKING

from tests.support.references import decoded_text, sampled_texts, teacher_forced_logprobs

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

    import torch
    from transformers import PreTrainedTokenizerBase

TOLERANCE = 1e-3
TEMPERATURE = 0.8
#: What SmolLM2's template puts first when the conversation has no system message.
DEFAULT_SYSTEM = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"

__all__ = [
    "DEFAULT_SYSTEM",
    "TEMPERATURE",
    "TOLERANCE",
    "check_rollout_output",
    "sampled_runs_and_logprob_gap",
    "sampled_texts",
]


def sampled_runs_and_logprob_gap(
    model: "torch.nn.Module",
    tokenizer: "PreTrainedTokenizerBase",
    prompt_ids: "Sequence[int]",
    completion_ids: "Sequence[int]",
    logprobs: "Sequence[float]",
    mask: "Sequence[int]",
) -> float:
    """Check one returned sample; return its decoded runs of mask-1 tokens and its largest logprob gap."""
    text = decoded_text(tokenizer, list(prompt_ids) + list(completion_ids))
    assert text.startswith(DEFAULT_SYSTEM), text[:200]
    assert text.count("<|im_start|>system") == 1, text  # the default system message is never rendered again
    reference = teacher_forced_logprobs(model, prompt_ids, completion_ids, TEMPERATURE)
    assert all(lp == 0.0 for lp, m in zip(logprobs, mask) if not m)
    return max(abs(lp - ref) for lp, ref, m in zip(logprobs, reference, mask) if m)


def check_rollout_output(
    model: "torch.nn.Module",
    tokenizer: "PreTrainedTokenizerBase",
    out: "Mapping[str, Any]",
    received_actions: "Sequence[Mapping[str, Any]]",
) -> None:
    """Every row of a rollout function's output: token-exact against ``model`` and the environment's record."""
    assert out["episode_status"] == ["finished"] * len(out["prompt_ids"]) and set(out["num_turns"]) == {3}
    gaps = [
        sampled_runs_and_logprob_gap(model, tokenizer, *row)
        for row in zip(out["prompt_ids"], out["completion_ids"], out["logprobs"], out["env_mask"])
    ]
    assert max(gaps) < TOLERANCE
    # the environment received exactly the decoded sampled text of each turn
    assert Counter(sampled_texts(tokenizer, out)) == Counter(tuple(ep["actions"]) for ep in received_actions)
