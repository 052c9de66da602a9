"""Behaviour cloning on demonstrations: the warm start that lets a tiny model write an environment's action format.

A randomly initialised tiny model (``tiny_model``) writes no valid action, so GRPO on it has nothing to rank. Cloning
it on a few demonstrations (each a conversation as the model will be prompted with it, and the answers to write
there, all equally often) teaches the format without the solution: trained on the exact ids it is later generated
after (the conversation rendered by ep_trl's ``ChatTemplate``), by maximum likelihood, the model ends up writing
each demonstrated answer with about the same probability. Which of them the task rewards is left for GRPO to find.

Training stops when every answer of every demonstration has at least :attr:`CloningRecipe.fair_share` of its fair
share (1 / number of answers) of the probability; the measured probabilities come back in :class:`ClonedModel`.
It runs on one torch thread (see ``tests/conftest.py`` on 2-core machines). The result is cached on disk under
:func:`default_cache_dir`, keyed by every input (the base model's files, the rendered demonstrations, the recipe,
the torch and transformers versions), so a machine builds each warm start once.
"""

import hashlib
import inspect
import json
import logging
import math
import os
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

logger = logging.getLogger(__name__)

#: The record written next to a cloned model: its measured answer probabilities and the steps it took.
RESULT_FILE = "ep_trl_cloning.json"


@dataclass(frozen=True)
class CloningTarget:
    """A conversation the model will be prompted with (ending before its turn) and the answers it should write
    there, each equally often."""

    messages: tuple[Mapping[str, Any], ...]
    answers: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.messages:
            raise ValueError(
                "CloningTarget(messages=()): give the conversation the model answers, e.g. "
                "({'role': 'user', 'content': 'Play.'},)"
            )
        if not self.answers or len(set(self.answers)) != len(self.answers) or not all(self.answers):
            raise ValueError(f"CloningTarget(answers={self.answers!r}): give one or more distinct, non-empty answers")


@dataclass(frozen=True)
class CloningRecipe:
    """How the model is cloned: full-batch Adam at ``learning_rate`` until every answer has ``fair_share`` of its
    fair probability, at most ``max_steps`` optimizer steps."""

    learning_rate: float = 5e-3
    fair_share: float = 0.9
    max_steps: int = 400
    seed: int = 0
    #: torch threads while cloning: 1 suits the tiny model beside a 2-core machine's other work; a real model wants
    #: every core.
    threads: int = 1

    def __post_init__(self) -> None:
        if not (math.isfinite(self.learning_rate) and self.learning_rate > 0):
            raise ValueError(f"CloningRecipe(learning_rate={self.learning_rate!r}): must be a finite number > 0")
        if not 0 < self.fair_share < 1:
            raise ValueError(f"CloningRecipe(fair_share={self.fair_share!r}): must be between 0 and 1 (exclusive)")
        if self.max_steps < 1:
            raise ValueError(f"CloningRecipe(max_steps={self.max_steps!r}): must be >= 1")
        if self.threads < 1:
            raise ValueError(f"CloningRecipe(threads={self.threads!r}): must be >= 1")


@dataclass(frozen=True)
class ClonedModel:
    """A cloned model directory, the probability it gives each answer (per demonstration, in order), the optimizer
    steps it took and whether it came from the cache."""

    path: Path
    answer_probabilities: tuple[tuple[float, ...], ...]
    steps: int
    cached: bool


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/ep_trl/cloned-models`` (``~/.cache/ep_trl/cloned-models`` by default)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ep_trl" / "cloned-models"


def clone_on_demonstrations(
    base_dir: str | Path,
    out_dir: str | Path,
    demonstrations: Sequence[CloningTarget],
    recipe: CloningRecipe = CloningRecipe(),
    *,
    cache_dir: Path | None = None,
) -> ClonedModel:
    """A copy of the model at ``base_dir``, at ``out_dir``, cloned on ``demonstrations`` (built once per machine and
    recipe: see the module docstring). Raises ``RuntimeError`` when ``recipe.max_steps`` is not enough."""
    if not demonstrations:
        raise ValueError("clone_on_demonstrations needs at least one CloningTarget")
    base, out = Path(base_dir), Path(out_dir)
    examples = _examples(AutoTokenizer.from_pretrained(base), demonstrations)
    cached = (cache_dir or default_cache_dir()) / _cache_key(base, examples, recipe)
    hit = (cached / RESULT_FILE).is_file()
    if not hit:
        building = cached.with_name(f"{cached.name}.building-{os.getpid()}")
        shutil.rmtree(building, ignore_errors=True)
        shutil.copytree(base, building)
        result = _train(building, examples, recipe)
        (building / RESULT_FILE).write_text(json.dumps(result) + "\n")
        shutil.rmtree(cached, ignore_errors=True)
        building.rename(cached)
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(cached, out)
    result = json.loads((out / RESULT_FILE).read_text())
    return ClonedModel(
        path=out,
        answer_probabilities=tuple(tuple(p) for p in result["answer_probabilities"]),
        steps=int(result["steps"]),
        cached=hit,
    )


def _cache_key(base: Path, examples: list[tuple[list[int], list[list[int]]]], recipe: CloningRecipe) -> str:
    import transformers

    digest = hashlib.sha256()
    for path in sorted(p for p in base.iterdir() if p.is_file()):
        digest.update(path.name.encode() + path.read_bytes())
    inputs = [examples, asdict(recipe), torch.__version__, transformers.__version__]
    digest.update(json.dumps(inputs, sort_keys=True).encode())
    return digest.hexdigest()[:24]


def answer_probabilities(
    model: Any, tokenizer: Any, demonstrations: Sequence[CloningTarget]
) -> tuple[tuple[float, ...], ...]:
    """The probability ``model`` gives each answer of each demonstration (answer ids then end of sequence, after
    the conversation rendered as ep_trl prompts it), teacher-forced, per demonstration in order. It shows what a
    policy would write on those pages: before training, after cloning, after GRPO."""
    batch = _batch(_examples(tokenizer, demonstrations), _pad_id(model))
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            probabilities = _answer_log_probs(model, batch).exp().tolist()
    finally:
        model.train(was_training)
    return _grouped(probabilities, [len(d.answers) for d in demonstrations])


def _examples(tokenizer: Any, demonstrations: Sequence[CloningTarget]) -> list[tuple[list[int], list[list[int]]]]:
    """Each demonstration's prompt ids (ep_trl's ``ChatTemplate``) and its answers' ids, end of sequence included."""
    from ..trajectory.template import ChatTemplate

    template = ChatTemplate(tokenizer)
    end = tokenizer.eos_token_id
    return [(template.prompt_ids(d.messages), [template.encode(a) + [end] for a in d.answers]) for d in demonstrations]


def _pad_id(model: Any) -> int:
    return model.config.pad_token_id if model.config.pad_token_id is not None else 0


def _batch(examples: list[tuple[list[int], list[list[int]]]], pad: int) -> list[tuple[torch.Tensor, ...]]:
    """Per demonstration: its prompt's ids (one row) and its answers' ids, padded on the right, with their mask.
    Every answer of a demonstration follows the same prompt, so the prompt is run once and the answers branch off its
    cache (:func:`_answer_log_probs`): a real model's prompts are hundreds of tokens and its answers a few."""
    batches: list[tuple[torch.Tensor, ...]] = []
    for prompt, answers in examples:
        width = max(len(a) for a in answers)
        ids = torch.full((len(answers), width), pad, dtype=torch.long)
        mask = torch.zeros((len(answers), width), dtype=torch.long)
        for r, answer in enumerate(answers):
            ids[r, : len(answer)] = torch.tensor(answer)
            mask[r, : len(answer)] = 1
        batches.append((torch.tensor([prompt]), ids, mask))
    return batches


def _answer_log_probs(model: Any, batches: list[tuple[torch.Tensor, ...]]) -> torch.Tensor:
    """Each answer's log-probability after its prompt, every demonstration's answers in order: the prompt run once,
    its cache repeated for the answers (gradients flow through both)."""
    found = []
    # transformers 5.2x names the cache ``cache`` (``past_key_values`` is deprecated); earlier 5.x ``past_key_values``
    cache_name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    for prompt, ids, mask in batches:
        head = model(input_ids=prompt, use_cache=True, logits_to_keep=1)
        cache = getattr(head, cache_name)
        cache.batch_repeat_interleave(ids.shape[0])
        length = prompt.shape[1]
        positions = torch.arange(length, length + ids.shape[1]).expand(ids.shape[0], -1)
        full_mask = torch.cat([torch.ones((ids.shape[0], length), dtype=mask.dtype), mask], dim=1)
        tail = model(input_ids=ids, attention_mask=full_mask, position_ids=positions, **{cache_name: cache}).logits
        # the prompt's last position predicts each answer's first id, answer position j predicts id j + 1
        logits = torch.cat([head.logits[:, -1:].expand(ids.shape[0], -1, -1), tail[:, :-1]], dim=1)
        token_log_probs = torch.log_softmax(logits, dim=-1).gather(2, ids.unsqueeze(2)).squeeze(2)
        found.append((token_log_probs * mask).sum(dim=1))
    return torch.cat(found)


def _grouped(values: list[float], sizes: list[int]) -> tuple[tuple[float, ...], ...]:
    grouped, at = [], 0
    for size in sizes:
        grouped.append(tuple(round(v, 4) for v in values[at : at + size]))
        at += size
    return tuple(grouped)


def _train(model_dir: Path, examples: list[tuple[list[int], list[list[int]]]], recipe: CloningRecipe) -> dict[str, Any]:
    """Clone the model in ``model_dir`` in place; its answer probabilities and steps taken."""
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    batch = _batch(examples, _pad_id(model))
    fair = [1.0 / len(answers) for _, answers in examples for _ in answers]
    threads = torch.get_num_threads()
    torch.set_num_threads(recipe.threads)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(recipe.seed)
            optimizer = torch.optim.Adam(model.parameters(), lr=recipe.learning_rate)
            model.train()
            began = time.monotonic()
            for step in range(recipe.max_steps + 1):
                log_probs = _answer_log_probs(model, batch)
                probabilities = log_probs.detach().exp().tolist()
                logger.info(
                    "cloning step %d (%.0f s): the least likely answer has %.2f of its fair share, wanted %.2f",
                    step,
                    time.monotonic() - began,
                    min(p / f for p, f in zip(probabilities, fair)),
                    recipe.fair_share,
                )
                if all(p >= recipe.fair_share * f for p, f in zip(probabilities, fair)):
                    break
                if step == recipe.max_steps:
                    worst = min(p / f for p, f in zip(probabilities, fair))
                    raise RuntimeError(
                        f"cloning did not converge in {recipe.max_steps} steps (the least likely answer has "
                        f"{worst:.2f} of its fair share, wanted {recipe.fair_share}): raise CloningRecipe.max_steps "
                        f"or learning_rate, or give fewer, shorter demonstrations"
                    )
                optimizer.zero_grad()
                (-log_probs.mean()).backward()
                optimizer.step()
    finally:
        torch.set_num_threads(threads)
    model.eval()
    model.save_pretrained(model_dir)
    grouped = _grouped(probabilities, [len(answers) for _, answers in examples])
    return {"answer_probabilities": [list(g) for g in grouped], "steps": step}
