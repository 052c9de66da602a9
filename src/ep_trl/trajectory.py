"""Token-exact multi-turn trajectories: one append-only token sequence per episode.

Layout (see docs/trajectory.md)::

    prompt_ids      = template(initial messages + first observation, add_generation_prompt)
    completion_ids  = sampled(turn 1) + bridge(1→2) + sampled(turn 2) + ... + sampled(turn N)
    env_mask        =   1 ... 1       +  0 ... 0    +   1 ... 1       + ... +   1 ... 1
    logprobs        = sampled logprobs +  0.0 ...   + sampled logprobs + ...

Every turn after the first is generated from exactly ``prompt_ids + completion_ids`` so far, so what the model
conditioned on is what the trainer scores. The bridge is what the chat template adds between the end of the
sampled turn and the next generation prompt: the end-of-turn marker when the model did not emit one, the
environment's next user message, and the assistant header.

Bridge rule. Render the whole conversation with the template. If that rendering starts with the tokens held
so far (the template is prefix-preserving and the sampled text re-tokenizes to the same ids), the bridge is
the rest of it ("clean"). Otherwise ("realigned": BPE re-tokenization differs, or the template rewrites
history, e.g. strips reasoning), the sampled ids are kept and the bridge is the template text that follows
the last assistant message, found by rendering it with a sentinel in place of its content; an end-of-turn
token the model already sampled is not repeated. Each realigned boundary is counted per episode.
"""

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .content import supports_images, template_messages
from .generation import Generation, SamplingParams

logger = logging.getLogger(__name__)

_SENTINEL = "\u2063ep_trl:assistant-content\u2063"


@dataclass(frozen=True)
class Trajectory:
    """What TRL receives for one episode."""

    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    env_mask: tuple[int, ...]
    realigned: int = 0

    @property
    def sampled_tokens(self) -> int:
        return sum(self.env_mask)

    def turn_numbers(self) -> tuple[int, ...]:
        """For each completion token: 0 if inserted (env_mask 0), else the 1-based turn that sampled it."""
        numbers: list[int] = []
        turn = previous = 0
        for m in self.env_mask:
            if m and not previous:
                turn += 1
            numbers.append(turn if m else 0)
            previous = m
        return tuple(numbers)

    def sampled_segments(self) -> list[tuple[int, ...]]:
        """The runs of model-sampled ids, one per turn, in order."""
        segments: dict[int, list[int]] = {}
        for tok, turn in zip(self.completion_ids, self.turn_numbers()):
            if turn:
                segments.setdefault(turn, []).append(tok)
        return [tuple(ids) for ids in segments.values()]


@dataclass(frozen=True)
class TurnLimits:
    """How far one episode's turns may go: the sampling settings (``max_tokens`` per turn), the completion tokens
    of the whole episode (sampled and inserted), the ids that end a turn, and the model's context length."""

    sampling: SamplingParams
    max_episode_tokens: int
    stop_token_ids: tuple[int, ...]
    max_model_len: int | None = None


@dataclass
class TrajectoryBuilder:
    """Accumulates one episode's tokens; append-only."""

    prompt_ids: tuple[int, ...]
    completion_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    env_mask: list[int] = field(default_factory=list)
    realigned: int = 0

    def context(self) -> list[int]:
        return list(self.prompt_ids) + self.completion_ids

    def add_sampled(self, generation: Generation) -> None:
        self.completion_ids.extend(generation.token_ids)
        self.logprobs.extend(generation.logprobs)
        self.env_mask.extend([1] * len(generation.token_ids))

    def add_inserted(self, token_ids: Sequence[int]) -> None:
        self.completion_ids.extend(token_ids)
        self.logprobs.extend([0.0] * len(token_ids))
        self.env_mask.extend([0] * len(token_ids))

    def build(self) -> Trajectory:
        return Trajectory(tuple(self.prompt_ids), tuple(self.completion_ids), tuple(self.logprobs),
                          tuple(self.env_mask), self.realigned)

    def fits(self, extra: int, limits: TurnLimits) -> bool:
        """Whether ``extra`` more completion tokens stay within the episode budget and the model's context."""
        if len(self.completion_ids) + extra > limits.max_episode_tokens:
            return False
        used = len(self.prompt_ids) + len(self.completion_ids) + extra
        return limits.max_model_len is None or used <= limits.max_model_len

    def turn_budget(self, limits: TurnLimits, max_tokens: int | None = None) -> int:
        """Tokens the next turn may sample: ``max_tokens`` (default: the sampling setting) within what is left."""
        remaining = limits.max_episode_tokens - len(self.completion_ids)
        if limits.max_model_len is not None:
            remaining = min(remaining, limits.max_model_len - len(self.prompt_ids) - len(self.completion_ids))
        return max(1, min(max_tokens or limits.sampling.max_tokens, remaining))


class ChatTemplate:
    """Renders conversations with the trainer's processing class; the only place text becomes token ids."""

    def __init__(self, processing_class: Any, template_kwargs: Mapping[str, Any] | None = None) -> None:
        self._renderer = processing_class
        self._tokenizer = getattr(processing_class, "tokenizer", processing_class)
        self._kwargs = dict(template_kwargs or {})
        self._images = supports_images(processing_class)  # else image parts are dropped, text parts joined
        self._warned_dropped_images = False
        if getattr(self._tokenizer, "chat_template", None) is None and getattr(processing_class, "chat_template", None) is None:
            raise ValueError(
                "The trainer's processing class has no chat template; multi-turn episodes need one. "
                "Load a chat/instruct tokenizer or set tokenizer.chat_template."
            )

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    def render(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None) -> str:
        """The conversation as the model sees it, ending with the assistant's generation prompt; ``tools`` (JSON
        schemas, as an OpenAI request carries them) are rendered the template's way."""
        converted, dropped = template_messages(messages, images=self._images)
        if dropped and not self._warned_dropped_images:
            self._warned_dropped_images = True
            logger.warning("The prompt builder returns image parts but %s is a text-only processing class: images "
                           "are dropped and the text parts joined (see docs/browsergym.md, vision-language models).",
                           type(self._renderer).__name__)
        extra = {"tools": list(tools)} if tools else {}
        return self._renderer.apply_chat_template(
            converted, tokenize=False, add_generation_prompt=True, **extra, **self._kwargs
        )

    def encode(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=False))

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._tokenizer.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    def prompt_ids(self, messages: Sequence[Mapping[str, Any]],
                   tools: Sequence[Mapping[str, Any]] | None = None) -> list[int]:
        return self.encode(self.render(messages, tools))

    def bridge(
        self, messages: Sequence[Mapping[str, Any]], held: Sequence[int], last_turn: Generation, stop_ids: Sequence[int],
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> tuple[list[int], bool]:
        """Tokens between the last sampled turn and the next generation prompt, and whether they were realigned.

        ``messages`` is the whole conversation, ending with the new user (or tool) messages; the last assistant
        message holds what ``last_turn`` sampled (its text, or the tool calls parsed from it).
        """
        full = self.encode(self.render(messages, tools))
        if full[: len(held)] == list(held):
            return full[len(held):], False
        assistant_at = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=None)
        if assistant_at is None:
            raise ValueError("bridge() needs a conversation with an assistant message")
        marked = [dict(m) for m in messages]
        marked[assistant_at] = {"role": "assistant", "content": _SENTINEL}  # tool calls were sampled too: held
        text = self.render(marked, tools)
        at = text.rfind(_SENTINEL)
        if at < 0:
            raise ValueError(
                "The chat template drops the assistant's content, so the tokens between turns cannot be found; "
                "pass chat_template_kwargs or a template that renders assistant messages."
            )
        tail = text[at + len(_SENTINEL):]
        if last_turn.token_ids and last_turn.token_ids[-1] in set(stop_ids):
            end_text = self.decode(last_turn.token_ids[-1:], skip_special_tokens=False)
            if end_text and tail.startswith(end_text):
                tail = tail[len(end_text):]
        return self.encode(tail), True
