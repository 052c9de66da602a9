"""An eval's score on rows kept out of training: the eval's own processor and body, run on those rows against an
OpenAI-compatible server (the vLLM server a run trains with), with the eval's own completion params.

This is the eval run as an eval, not as training: the processor calls the server's ``/v1/chat/completions`` through
LiteLLM as it would under ``pytest`` (the eval's ``temperature``, 0.0 for greedy decoding, and ``max_tokens`` apply),
and the body scores what came back. ``ep-trl train --held-out N`` calls it before and after training. Why not the
rollout function: training samples at the trainer's temperature and captures token ids; a held-out score is what the
eval itself reports.

Evals with an ``OpenEnvRolloutProcessor`` are refused there: their loop needs an environment and the rollout
function. :func:`play_held_out` plays those: held-out episodes through ep_trl's own loop (the eval's prompt builder,
action parser and body), greedily, on instances the caller's environment factory holds out (for MiniWoB:
``ep_trl.devtools.miniwob_instances``), with each episode's turns, whether each turn's action parsed, and its score.
"""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypedDict

from ..errors import UnsupportedEvalError
from ..evalprotocol import eval_rows, match_rows, read_eval_spec, resolve_eval_test, run_body, score_of
from ..evalprotocol import processors

if TYPE_CHECKING:
    from ..adapters.rollout_func import RolloutFunction
    from ..evalprotocol.spec import EvalSpec
    from ..trajectory.types import Prompt, Row, Settings, Tokenizer

#: How long one row's processor run and one body call may take.
ROW_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class HeldOutScore:
    """The eval's scores on the held-out rows (None for a row its body left unscored), the model's replies, the
    body's reasons, and their mean."""

    scores: tuple[float | None, ...]
    replies: tuple[str, ...]
    reasons: tuple[str, ...]

    @property
    def mean(self) -> float:
        """The mean over all rows, an unscored row counting 0 (as the eval's own aggregate would fail it)."""
        return statistics.fmean(score or 0.0 for score in self.scores) if self.scores else 0.0

    @property
    def unscored(self) -> int:
        return sum(score is None for score in self.scores)


def score_held_out(env_path: str, prompts: Sequence[Prompt], *, base_url: str, model: str,
                   concurrency: int = 16, input_dataset: Sequence[str] | None = None) -> HeldOutScore:
    """Run ``env_path``'s processor and body on the eval rows behind ``prompts`` (from ``dataset_from_eval``: each
    carries its row key) with ``model`` served at ``base_url`` (``http://host:port``, no ``/v1``); ``input_dataset``:
    the files the prompts' rows were read from in place of the eval's own (as ``dataset_from_eval``'s).

    A row whose processor run raises counts as unscored (its reply is the error), as under ``pytest`` it would fail.
    """
    eval_test = resolve_eval_test(env_path)
    spec = read_eval_spec(eval_test)
    if spec.processor is None:
        raise UnsupportedEvalError(f"{spec.qualified_name} plays an OpenEnv environment loop; score_held_out runs an "
                                   "eval's own processor, which OpenEnvRolloutProcessor evals train through ep_trl's "
                                   "loop instead. Score held-out rows with the rollout function.")
    rows = match_rows(list(prompts), eval_rows(eval_test, input_dataset), spec.qualified_name)
    params = processors.routed_params(spec.completion_params, model, f"{base_url.rstrip('/')}/v1", "EMPTY")
    return asyncio.run(_score(spec, rows, params, concurrency))


async def _score(spec: EvalSpec, rows: list[Row], params: Settings, concurrency: int) -> HeldOutScore:
    semaphore = asyncio.Semaphore(concurrency)
    processors.setup(spec)
    try:
        finished = await asyncio.gather(*(_run(spec, row, params, semaphore) for row in rows))
    finally:
        await processors.cleanup(spec)
    done = [row for row in finished if not isinstance(row, BaseException)]
    if spec.mode == "pointwise":
        scored = [(await run_body(spec, [row], ROW_TIMEOUT_S))[0] for row in done]
    else:
        scored = await run_body(spec, done, ROW_TIMEOUT_S) if done else []
    by_row = iter(scored)
    scores: list[float | None] = []
    replies: list[str] = []
    reasons: list[str] = []
    for row in finished:
        if isinstance(row, BaseException):
            scores.append(None)
            replies.append(f"{type(row).__name__}: {row}")
            reasons.append("the processor raised")
        else:
            out = next(by_row)
            scores.append(score_of(out))
            last = out.messages[-1] if out.messages else None
            replies.append(str(last.content or "") if last is not None and last.role == "assistant" else "")
            result = out.evaluation_result
            reasons.append(str(result.reason or "") if result is not None else "the body left it unscored")
    return HeldOutScore(tuple(scores), tuple(replies), tuple(reasons))


async def _run(spec: EvalSpec, row: Row, params: Settings, semaphore: asyncio.Semaphore) -> Row | Exception:
    try:
        return await asyncio.wait_for(processors.run_row(spec, row, params, semaphore, _NoLog(), None),
                                      ROW_TIMEOUT_S)
    except Exception as exc:  # the processor's failure costs this row, as a failed row would under pytest
        return exc


class _NoLog:
    """The processor's dataset logger: held-out rows are not training rollouts and stay out of ``ep logs``."""

    def log(self, row: Row) -> None:
        return None

    def read(self, *args: object, **kwargs: object) -> list[Row]:
        return []


@dataclass(frozen=True)
class HeldOutEpisode:
    """One held-out episode of an environment eval: its task, the model's turns (the text it sampled), whether
    each turn's action parsed (False: the eval's action parser fell back), the eval body's score (None: unscored)
    and the episode's status (``"finished"`` or ``"error"``)."""

    task: str | None
    turns: tuple[str, ...]
    parsed: tuple[bool, ...]
    score: float | None
    status: str
    #: The episode's prompt ids and completion ids (its turns, and the observations and template between them).
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def well_formed(self) -> bool:
        """Every turn's action parsed (an episode with no turn is not well formed)."""
        return bool(self.parsed) and all(self.parsed)


class HeldOutFigures(TypedDict):
    """What a run reports of its held-out episodes (:meth:`HeldOutEpisodes.figures`)."""

    success: float
    well_formed_rate: float
    success_when_well_formed: float | None
    per_task: dict[str, float]
    episodes: int


@dataclass(frozen=True)
class HeldOutEpisodes:
    """Held-out episodes and the three figures a run reports: task success, the rate of well-formed actions, and
    success among episodes whose actions all parsed (the part of success that the format alone cannot carry)."""

    episodes: tuple[HeldOutEpisode, ...]

    @property
    def success(self) -> float:
        """Mean score, an unscored episode counting 0."""
        return statistics.fmean(e.score or 0.0 for e in self.episodes) if self.episodes else 0.0

    @property
    def well_formed_rate(self) -> float:
        """Share of all model turns whose action parsed."""
        parsed = [p for e in self.episodes for p in e.parsed]
        return sum(parsed) / len(parsed) if parsed else 0.0

    @property
    def success_when_well_formed(self) -> float | None:
        """Mean score of the episodes whose actions all parsed; None when there is none."""
        formed = [e.score or 0.0 for e in self.episodes if e.well_formed]
        return statistics.fmean(formed) if formed else None

    def per_task(self) -> dict[str, float]:
        """Success per task."""
        tasks = sorted({e.task or "" for e in self.episodes})
        return {t: statistics.fmean(e.score or 0.0 for e in self.episodes if (e.task or "") == t) for t in tasks}

    def figures(self) -> HeldOutFigures:
        return {"success": self.success, "well_formed_rate": self.well_formed_rate,
                "success_when_well_formed": self.success_when_well_formed, "per_task": self.per_task(),
                "episodes": len(self.episodes)}

    def summary(self, when: str) -> str:
        """The line a run prints: the three figures (and success per task), ``when`` ("before training", ...)."""
        per_task = ", ".join(f"{task} {value:.3f}" for task, value in self.per_task().items())
        return (f"held-out {when}: task success {self.success:.3f} ({per_task}); well-formed actions "
                f"{self.well_formed_rate:.3f}; success among well-formed episodes "
                f"{format_figure(self.success_when_well_formed)} ({len(self.episodes)} episodes, greedy)")

    def rows(self) -> list[dict[str, object]]:
        """Every episode as a result file keeps it: task, turns, whether each parsed, score, status, tokens."""
        return [{"task": e.task, "turns": list(e.turns), "parsed": list(e.parsed), "score": e.score,
                 "status": e.status, "prompt_tokens": e.prompt_tokens, "completion_tokens": e.completion_tokens}
                for e in self.episodes]


def format_figure(value: float | None) -> str:
    """A figure to three decimals, or "n/a" when there is none (no well-formed episode)."""
    return "n/a" if value is None else f"{value:.3f}"


def play_held_out(rollout: RolloutFunction, prompt: Prompt, *, tasks: Sequence[str], episodes: int,
                  tokenizer: Tokenizer, base_url: str, parsed: Callable[[str], bool],
                  max_episode_tokens: int) -> HeldOutEpisodes:
    """Play ``episodes`` greedy episodes of an environment eval with ``rollout`` (a rollout function built on the
    eval, with ``backend="vllm"``, whose environment factory hands out the held-out instances) on the vLLM server at
    ``base_url``, and score them with the eval's body, as training plays them: the same loop, prompt builder, action
    parser and body, at temperature 0. Episode ``i`` plays ``tasks[i % len(tasks)]`` (ep_trl's task rotation, one
    episode per group). ``parsed(text)`` says whether the eval's action parser found an action in a turn's text."""
    from ..engine.caller import DetachedCaller, SyncedServer, TrainingConfig
    from ..generation import SamplingParams

    config = TrainingConfig(processing_class=tokenizer, num_generations=1, max_completion_length=max_episode_tokens,
                            sampling=SamplingParams(temperature=0.0), vllm_mode="server")
    caller = DetachedCaller(config, step=0, server=SyncedServer(base_url), metrics_sink=lambda metrics: None)
    out = rollout.run([prompt] * episodes, caller, first_group=0)
    played = []
    for i, (prompt_ids, ids, mask, score, status) in enumerate(zip(
            out["prompt_ids"], out["completion_ids"], out["env_mask"], out["eval_score"], out["episode_status"])):
        turns = tuple(_text(tokenizer, turn) for turn in _sampled_turns(ids, mask))
        played.append(HeldOutEpisode(task=tasks[i % len(tasks)] if tasks else None, turns=turns,
                                     parsed=tuple(parsed(t) for t in turns), score=score, status=status,
                                     prompt_tokens=len(prompt_ids), completion_tokens=len(ids)))
    return HeldOutEpisodes(tuple(played))


def _text(tokenizer: Tokenizer, ids: list[int]) -> str:
    """One model turn's text, its special tokens left out."""
    text = tokenizer.decode(ids, skip_special_tokens=True)
    assert isinstance(text, str), "decode of one sequence returns its text"
    return text.strip()


def _sampled_turns(ids: Sequence[int], mask: Sequence[int]) -> list[list[int]]:
    """The runs of sampled ids (``env_mask`` 1) of a completion: one per model turn."""
    turns: list[list[int]] = []
    previous = 0
    for token, sampled in zip(ids, mask):
        if sampled and not previous:
            turns.append([])
        if sampled:
            turns[-1].append(token)
        previous = sampled
    return turns
