"""The reference every logprob test compares against: a model's own logprobs of given tokens."""

from collections.abc import Sequence

import torch


def teacher_forced_logprobs(model, prompt_ids: Sequence[int], completion_ids: Sequence[int],
                            temperature: float = 1.0) -> list[float]:
    """Logprob of each ``completion_ids`` token after ``prompt_ids`` and the tokens before it, at ``temperature``."""
    ids = torch.tensor([list(prompt_ids) + list(completion_ids)])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt_ids) - 1: -1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(list(completion_ids))[:, None])[:, 0].tolist()
