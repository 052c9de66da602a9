"""What tests compare rollout output against, computed independently of ep_trl's own code."""

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def teacher_forced_logprobs(
    model: torch.nn.Module,
    prompt_ids: Sequence[int],
    completion_ids: Sequence[int],
    temperature: float = 1.0,
    device: str | torch.device | None = None,
) -> list[float]:
    """Logprob of each ``completion_ids`` token after ``prompt_ids`` and the tokens before it, at ``temperature``,
    computed on ``device`` (default: where the model's weights are; the model is moved there when it differs)."""
    device = torch.device(device) if device is not None else next(model.parameters()).device
    model = model.to(device)
    ids = torch.tensor([list(prompt_ids) + list(completion_ids)], device=device)
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt_ids) - 1 : -1].float() / temperature
    targets = torch.tensor(list(completion_ids), device=device)[:, None]
    return torch.log_softmax(logits, -1).gather(-1, targets)[:, 0].tolist()


def decoded_text(tokenizer: "PreTrainedTokenizerBase", ids: Sequence[int], skip_special_tokens: bool = False) -> str:
    """The text of one token sequence (``decode`` of a single sequence returns a string)."""
    text = tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)
    assert isinstance(text, str), "decode of one sequence returns its text"
    return text


def sampled_texts(tokenizer: "PreTrainedTokenizerBase", out: Mapping[str, Any]) -> list[tuple[str, ...]]:
    """Per returned row, the decoded text of each run of ``env_mask`` 1 tokens (one per model turn)."""
    rows: list[tuple[str, ...]] = []
    for ids, mask in zip(out["completion_ids"], out["env_mask"]):
        runs: list[list[int]] = []
        current: list[int] = []
        for token, sampled in zip(ids, mask):
            if sampled:
                current.append(token)
            elif current:
                runs.append(current)
                current = []
        runs.append(current)
        rows.append(tuple(decoded_text(tokenizer, run, skip_special_tokens=True) for run in runs))
    return rows
