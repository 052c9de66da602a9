"""An eval-protocol policy backed by the tiny local model (transformers ``generate``).

``OpenEnvRolloutProcessor`` accepts a ``policy_factory`` whose product has
``async _make_llm_call(messages, tools)`` returning an OpenAI-shaped dict. This
one runs the real tiny model on CPU, so eval modules can be exercised under
eval-protocol's own processor without any model server.
"""

import asyncio
import logging
from pathlib import Path
from typing import Any, cast

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

logger = logging.getLogger(__name__)


class TinyModelPolicy:
    """Greedy (temperature 0) or sampled generation with the tiny model."""

    def __init__(self, model_dir: Path, *, max_tokens: int, temperature: float = 0.0, seed: int = 0) -> None:
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir)
        self.model.eval()
        self.max_tokens = int(max_tokens)
        self.temperature = float(temperature)
        self.seed = seed

    def _generate(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        """Template the conversation, generate, and return an OpenAI-shaped response."""
        chat = [{"role": m["role"], "content": m.get("content") or ""} for m in messages]
        # one conversation, tokenized (the default), not as a dict: its token ids
        prompt_ids = cast(
            list[int], self.tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_dict=False)
        )
        sample = self.temperature > 0
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            out = self.model.generate(
                torch.tensor([prompt_ids]),
                attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
                max_new_tokens=self.max_tokens,
                do_sample=sample,
                temperature=self.temperature if sample else None,
                top_p=None,
                top_k=None,
                pad_token_id=self.tokenizer.pad_token_id,
            )
        completion_ids = out[0, len(prompt_ids) :].tolist()
        content = self.tokenizer.decode(completion_ids, skip_special_tokens=True)
        return {
            "choices": [{"message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
            "usage": {
                "prompt_tokens": len(prompt_ids),
                "completion_tokens": len(completion_ids),
                "total_tokens": len(prompt_ids) + len(completion_ids),
            },
            "prompt_ids": prompt_ids,
            "completion_ids": completion_ids,
        }

    async def _make_llm_call(self, messages: list[dict[str, Any]], tools: list[Any]) -> dict[str, Any]:
        """eval-protocol's policy hook; generation runs in a worker thread."""
        return await asyncio.to_thread(self._generate, messages)
