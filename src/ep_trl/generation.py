"""What every generation backend takes and returns, so episodes do not care which one runs.

A backend receives the exact token ids the model must condition on and returns the ids it sampled with the
log-probability of each sampled token at the trainer's temperature, the quantity TRL's loss and
importance-sampling ratio compare against. Nothing is decoded and re-encoded on the way.
"""

from dataclasses import dataclass, replace
from typing import Protocol, Sequence


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings for one turn. Temperature/top-p/top-k come from the GRPOConfig; max_tokens and stop
    from the eval's completion params (clipped to the episode's remaining token budget)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    max_tokens: int = 64
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None

    def with_max_tokens(self, max_tokens: int) -> "SamplingParams":
        return replace(self, max_tokens=max_tokens)


@dataclass(frozen=True)
class Generation:
    """One sampled continuation: its ids, one logprob per id, and why it stopped ("stop" or "length")."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: str
    stop_text: str | None = None

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.logprobs):
            raise ValueError(
                f"backend returned {len(self.token_ids)} token ids but {len(self.logprobs)} logprobs; they must align"
            )


class Generator(Protocol):
    """A generation backend. Implementations must be safe to call from many episodes at once."""

    name: str

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Generation: ...

    async def aclose(self) -> None: ...
