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

The chat template that renders each turn and finds each bridge is ``ep_trl.trajectory.template`` (``ChatTemplate``).
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import TYPE_CHECKING

from .content import tokenizer_of
from .sampling import Generation, PromptIds, PromptImages, SamplingParams, ids_json
from .types import (
    Image,
    Model,
    ProcessingClass,
    Tokenizer,
)

if TYPE_CHECKING:  # torch and numpy are imported by the processing class, not with ep_trl
    from .sample_images import ProcessedImages


#: A run of sampled tokens in a mask written as bytes.
_SAMPLED_RUN = re.compile(b"[^\x00]+")

#: Encoded conversation prefixes kept per chat template (one or two per running episode are in use).
_PREFIX_CACHE_SIZE = 512
#: How many of a text's last cut points are looked up in the prefix cache (a turn adds a few messages).
_PREFIX_LOOKUPS = 16
#: Texts after the last cut (a template's generation prompt, mostly) kept with their ids, and the longest kept.
_TAIL_CACHE_SIZE = 64
_TAIL_MAX_CHARS = 256


@dataclass(frozen=True)
class Encoded:
    """Template text as token ids. ``ids`` hold every image placeholder expanded by the processing class, ``images`` are
    the images in placeholder order, ``unexpanded`` the same text with each placeholder as the template wrote it
    (None: no images, the same as ``ids``)."""

    ids: tuple[int, ...]
    images: tuple[Image, ...] = ()
    unexpanded: tuple[int, ...] | None = None

    @property
    def unexpanded_ids(self) -> tuple[int, ...]:
        return self.ids if self.unexpanded is None else self.unexpanded


def cut_tokens(tokenizer: Tokenizer) -> tuple[str, ...]:
    """The special tokens a text can be cut before and encoded in two parts with the same ids as in one.

    A fast (``tokenizers``) tokenizer splits its input on added tokens before anything else, and encodes each piece
    in between on its own. So a text cut just before a special token ``S`` encodes, part by part, to the ids of the
    whole, provided ``S`` is always matched where it starts: it strips no whitespace (``lstrip``/``rstrip``), is
    matched on the raw text (not ``normalized``, not ``single_word``), and no added token holds ``S``'s first
    character after its own first one (so no match can start before the cut and reach into ``S``). None (no cuts,
    every text encoded whole) for a slow tokenizer or one that splits special tokens as text."""
    decoder = getattr(tokenizer, "added_tokens_decoder", None)
    if (
        getattr(tokenizer, "backend_tokenizer", None) is None
        or not isinstance(decoder, Mapping)
        or getattr(tokenizer, "split_special_tokens", False)
    ):
        return ()
    added = [t for t in decoder.values() if isinstance(getattr(t, "content", None), str) and t.content]
    inner = {c for t in added for c in t.content[1:]}
    return tuple(
        sorted(
            t.content
            for t in added
            if getattr(t, "special", False)
            and not (t.lstrip or t.rstrip or t.normalized or t.single_word)
            and t.content[0] not in inner
        )
    )


class PrefixEncoder:
    """Encodes conversations turn after turn in time linear in what a turn adds, with the ids a whole encode gives.

    A multi-turn episode renders its whole conversation every turn (``ChatTemplate.bridge``), and encoding it whole
    is quadratic in turns. Texts are cut before special tokens (``cut_tokens``), the ids of the part before the last
    cut are kept (bounded, least recently used first out), and the next text that starts with a kept part encodes
    only what follows it. What follows the last cut, the same generation prompt turn after turn, is encoded once
    (short texts, a few kept)."""

    def __init__(self, encode: Callable[[str], list[int]], cuts: Sequence[str], size: int = _PREFIX_CACHE_SIZE) -> None:
        self._encode = encode  # text -> list of ids, the tokenizer's own
        self._cuts = tuple(cuts)
        self._size = size
        self._kept: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        self._tails: dict[str, tuple[int, ...]] = {}

    def __call__(self, text: str) -> list[int]:
        points = self._cut_points(text)
        if not points:
            return self._encode(text)
        start, ids = 0, []
        for at in points:  # newest first: the longest kept prefix wins
            kept = self._kept.get(text[:at])
            if kept is not None:
                self._kept.move_to_end(text[:at])
                start, ids = at, list(kept)
                break
        last = points[0]
        if last > start:
            ids += self._encode(text[start:last])
            self._keep(text[:last], tuple(ids))
        return ids + self._tail(text[last:])

    def _tail(self, tail: str) -> list[int]:
        """``tail``'s ids, as its own encode gives them (kept if short; the oldest kept goes first when full)."""
        ids = self._tails.get(tail)
        if ids is None:
            encoded = self._encode(tail)
            if len(tail) > _TAIL_MAX_CHARS:
                return encoded
            if len(self._tails) >= _TAIL_CACHE_SIZE:
                del self._tails[next(iter(self._tails))]
            ids = self._tails[tail] = tuple(encoded)
        return list(ids)

    def _cut_points(self, text: str) -> list[int]:
        """Positions > 0 where a cut token starts, last first, at most ``_PREFIX_LOOKUPS``."""
        found: list[int] = []
        for cut in self._cuts:
            end = len(text)
            for _ in range(_PREFIX_LOOKUPS):
                at = text.rfind(cut, 0, end)
                if at <= 0:
                    break
                found.append(at)
                end = at
        found.sort(reverse=True)
        return found[:_PREFIX_LOOKUPS]

    def _keep(self, prefix: str, ids: tuple[int, ...]) -> None:
        self._kept[prefix] = ids
        self._kept.move_to_end(prefix)
        while len(self._kept) > self._size:
            self._kept.popitem(last=False)


@dataclass(frozen=True)
class Trajectory:
    """What TRL receives for one episode; ``images`` are its images in placeholder order, prompt then completion."""

    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    env_mask: tuple[int, ...]
    realigned: int = 0
    images: tuple[Image, ...] = ()
    #: What the processing class made of ``images`` when they were rendered (their pixel tensors joined as one row),
    #: for a consumer that would otherwise process them again (``EvalRolloutWorker``'s samples); None: not kept. Not
    #: compared: tensors have no truth value.
    processed: ProcessedImages | None = field(default=None, compare=False)

    @property
    def sampled_tokens(self) -> int:
        return sum(self.env_mask)

    @cached_property
    def sampled_runs(self) -> tuple[tuple[int, int], ...]:
        """``(start, end)`` in ``completion_ids`` of each run of model-sampled ids (``env_mask`` 1), one per turn,
        found once per trajectory (metrics, output and rows all ask)."""
        return tuple(found.span() for found in _SAMPLED_RUN.finditer(bytes(map(bool, self.env_mask))))

    def turn_numbers(self) -> tuple[int, ...]:
        """For each completion token: 0 if inserted (env_mask 0), else the 1-based turn that sampled it."""
        numbers = [0] * len(self.env_mask)
        for turn, (start, end) in enumerate(self.sampled_runs, 1):
            numbers[start:end] = [turn] * (end - start)
        return tuple(numbers)

    def sampled_segments(self) -> list[tuple[int, ...]]:
        """The runs of model-sampled ids, one per turn, in order."""
        return [self.completion_ids[start:end] for start, end in self.sampled_runs]

    def without_images(self) -> "Trajectory":
        """The same tokens without the images, for what keeps an episode after its images are handed on (metrics,
        the rollout log): they are freed with the samples that carry them."""
        return replace(self, images=(), processed=None) if self.images else self


def eos_token_ids(processing_class: ProcessingClass, model: "Model | None") -> tuple[int, ...]:
    """End-of-turn ids: the tokenizer's EOS plus the model's generation-config EOS ids."""
    tokenizer = tokenizer_of(processing_class)
    ids: list[int] = []
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.append(int(tokenizer.eos_token_id))
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(gen_eos, int):
        ids.append(gen_eos)
    elif gen_eos:
        ids.extend(int(t) for t in gen_eos)
    return tuple(dict.fromkeys(ids))


@dataclass(frozen=True)
class TurnLimits:
    """How far one episode's turns may go: the sampling settings (``max_tokens`` per turn), the completion tokens
    of the whole episode (sampled and inserted), the ids that end a turn, and ``max_model_len`` (the most
    prompt and completion tokens the model takes)."""

    sampling: SamplingParams
    max_episode_tokens: int
    stop_token_ids: tuple[int, ...]
    max_model_len: int | None = None


@dataclass
class TrajectoryBuilder:
    """Accumulates one episode's tokens (and images); append-only."""

    prompt_ids: tuple[int, ...]
    completion_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    env_mask: list[int] = field(default_factory=list)
    realigned: int = 0
    images: list[Image] = field(default_factory=list)
    unexpanded: list[int] = field(default_factory=list)  # prompt + completion, placeholders unexpanded
    #: The held ids' JSON array without its brackets, kept as ids are added, and how many ids it holds (-1: none yet).
    _json: str = field(default="", init=False, repr=False, compare=False)
    _json_ids: int = field(default=-1, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.unexpanded:
            self.unexpanded = list(self.prompt_ids) + self.completion_ids

    @classmethod
    def start(cls, prompt: Encoded) -> "TrajectoryBuilder":
        return cls(prompt.ids, images=list(prompt.images), unexpanded=list(prompt.unexpanded_ids))

    def held_ids(self) -> PromptIds:
        """Prompt and completion ids so far, with their JSON text (a server backend sends it as is)."""
        n = len(self.prompt_ids) + len(self.completion_ids)
        if self._json_ids != n:  # not kept yet, or the lists changed other than through add_*: encode them whole
            self._json, self._json_ids = ids_json(list(self.prompt_ids) + self.completion_ids)[1:-1], n
        ids = PromptIds(self.prompt_ids, f"[{self._json}]")
        ids.extend(self.completion_ids)
        return ids

    def _extend_json(self, ids: Sequence[int], held: int) -> None:
        """Add ``ids`` (appended after ``held`` ids) to the kept JSON text, if it holds exactly those ``held``."""
        if ids and self._json_ids == held:
            part = ids_json(ids)[1:-1]
            self._json = f"{self._json},{part}" if self._json else part
            self._json_ids += len(ids)

    def held(self) -> Encoded:
        """The ids held so far, with their images."""
        return Encoded(tuple(self.prompt_ids) + tuple(self.completion_ids), tuple(self.images), tuple(self.unexpanded))

    def held_images(self) -> PromptImages | None:
        """What the next turn's generation needs besides the ids: None when the held ids hold no image."""
        return PromptImages(tuple(self.images), tuple(self.unexpanded)) if self.images else None

    def add_sampled(self, generation: Generation) -> None:
        self._extend_json(generation.token_ids, len(self.prompt_ids) + len(self.completion_ids))
        self.completion_ids.extend(generation.token_ids)
        self.logprobs.extend(generation.logprobs)
        self.env_mask.extend([1] * len(generation.token_ids))
        self.unexpanded.extend(generation.token_ids)

    def add_inserted(self, segment: Encoded | Sequence[int]) -> None:
        """Template tokens between turns (``env_mask`` 0), with the images they hold."""
        if not isinstance(segment, Encoded):
            segment = Encoded(tuple(segment))
        self._extend_json(segment.ids, len(self.prompt_ids) + len(self.completion_ids))
        self.completion_ids.extend(segment.ids)
        self.logprobs.extend([0.0] * len(segment.ids))
        self.env_mask.extend([0] * len(segment.ids))
        self.images.extend(segment.images)
        self.unexpanded.extend(segment.unexpanded_ids)

    def build(self) -> Trajectory:
        return Trajectory(
            tuple(self.prompt_ids),
            tuple(self.completion_ids),
            tuple(self.logprobs),
            tuple(self.env_mask),
            self.realigned,
            tuple(self.images),
        )

    def fits(self, extra: int, limits: TurnLimits) -> bool:
        """Whether ``extra`` more completion tokens stay within the episode budget and ``max_model_len``."""
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
