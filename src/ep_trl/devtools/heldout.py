"""An eval's score on rows kept out of training: the eval's own processor and body, run on those rows against an
OpenAI-compatible server (the vLLM server a run trains with), with the eval's own completion params.

This is the eval run as an eval, not as training: the processor calls the server's ``/v1/chat/completions`` through
LiteLLM as it would under ``pytest`` (the eval's ``temperature``, 0.0 for greedy decoding, and ``max_tokens`` apply),
and the body scores what came back. ``train_smollm2_trl.py`` calls it before and after training. Why not the
rollout function: training samples at the trainer's temperature and captures token ids; a held-out score is what the
eval itself reports.

Evals with an ``OpenEnvRolloutProcessor`` are refused: their loop needs an environment and the rollout function.
"""

import asyncio
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import UnsupportedEvalError
from ..evalprotocol import eval_rows, match_rows, read_eval_spec, resolve_eval_test, run_body, score_of
from ..evalprotocol import processors

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


def score_held_out(env_path: str, prompts: Sequence[Any], *, base_url: str, model: str,
                   concurrency: int = 16) -> HeldOutScore:
    """Run ``env_path``'s processor and body on the eval rows behind ``prompts`` (from ``dataset_from_eval``: each
    carries its row key) with ``model`` served at ``base_url`` (``http://host:port``, no ``/v1``).

    A row whose processor run raises counts as unscored (its reply is the error), as under ``pytest`` it would fail.
    """
    eval_test = resolve_eval_test(env_path)
    spec = read_eval_spec(eval_test)
    if spec.processor is None:
        raise UnsupportedEvalError(f"{spec.qualified_name} plays an OpenEnv environment loop; score_held_out runs an "
                                   "eval's own processor, which OpenEnvRolloutProcessor evals train through ep_trl's "
                                   "loop instead. Score held-out rows with the rollout function.")
    rows = match_rows(list(prompts), eval_rows(eval_test), spec.qualified_name)
    params = processors.routed_params(spec.completion_params, model, f"{base_url.rstrip('/')}/v1", "EMPTY")
    return asyncio.run(_score(spec, rows, params, concurrency))


async def _score(spec: Any, rows: list[Any], params: dict[str, Any], concurrency: int) -> HeldOutScore:
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
    scores, replies, reasons = [], [], []
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


async def _run(spec: Any, row: Any, params: dict[str, Any], semaphore: asyncio.Semaphore) -> Any:
    try:
        return await asyncio.wait_for(processors.run_row(spec, row, params, semaphore, _NoLog(), None),
                                      ROW_TIMEOUT_S)
    except Exception as exc:  # the processor's failure costs this row, as a failed row would under pytest
        return exc


class _NoLog:
    """The processor's dataset logger: held-out rows are not training rollouts and stay out of ``ep logs``."""

    def log(self, row: Any) -> None:
        return None

    def read(self, *args: Any, **kwargs: Any) -> list[Any]:
        return []
