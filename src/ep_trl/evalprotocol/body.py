"""Run an eval's body as eval-protocol would, on rows shaped like the ones its processor builds."""

import asyncio
import inspect
import math
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NotRequired, TypedDict, Unpack

from ..errors import UnsupportedEvalError
from ..runtime.threads import run_blocking
from ..trajectory.types import MessagesView, Row, Settings
from .spec import EvalSpec


@dataclass(frozen=True)
class Scored:
    """The eval's verdict on one row: its score (None when unscored), the row the body returned, and why not."""

    score: float | None
    row: Row
    error: str | None = None


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


class RowStamp(TypedDict):
    """The keyword arguments of :func:`stamp_row`, which :func:`build_row` passes on."""

    eval_name: str
    rollout_id: str
    invocation_id: str
    experiment_id: str
    run_id: str
    completion_params: Settings
    extra: Settings
    usage: NotRequired[Mapping[str, int] | None]
    duration_s: NotRequired[float | None]


def build_row(*, messages: MessagesView, row_id: str, **stamp: Unpack[RowStamp]) -> Row:
    """An ``EvaluationRow`` shaped like the one OpenEnvRolloutProcessor hands the eval body (see ``stamp_row``)."""
    from eval_protocol.models import EvaluationRow, InputMetadata, Message

    row = EvaluationRow(messages=[Message(**dict(m)) for m in messages], input_metadata=InputMetadata(row_id=row_id))
    return stamp_row(row, **stamp)


def stamp_row(
    row: Row,
    *,
    eval_name: str,
    rollout_id: str,
    invocation_id: str,
    experiment_id: str,
    run_id: str,
    completion_params: Settings,
    extra: Settings,
    usage: Mapping[str, int] | None = None,
    duration_s: float | None = None,
) -> Row:
    """``row`` with a training rollout's ids, completion params, eval metadata and ``extra`` set, as
    ``evaluation_test`` sets them on the rows it hands the processor and the body."""
    from eval_protocol.models import EvalMetadata

    row.input_metadata.completion_params = dict(completion_params)
    row.eval_metadata = EvalMetadata(
        name=eval_name,
        version="ep_trl",
        status=None,
        num_runs=1,
        aggregation_method="mean",
        passed_threshold=None,
        passed=None,
    )
    meta = row.execution_metadata
    meta.rollout_id = rollout_id
    meta.invocation_id = invocation_id
    meta.experiment_id = experiment_id
    meta.run_id = run_id
    meta.extra = dict(extra)
    if usage is not None:
        from openai.types import CompletionUsage

        meta.usage = CompletionUsage.model_validate(dict(usage))
    if duration_s is not None:
        meta.rollout_duration_seconds = duration_s
    return row


async def run_body(spec: EvalSpec, rows: list[Row], timeout_s: float) -> list[Row]:
    """Run the eval body as eval-protocol would: per row (pointwise) or on the list (groupwise, all).

    Sync bodies run in a thread of their own so a slow scorer does not stall the episodes still in flight; each
    call may take ``timeout_s`` (then ``TimeoutError``).
    """
    kwargs = dict(spec.evaluation_test_kwargs)
    what = f"the eval body of {spec.qualified_name}"

    async def call(arg: Row | list[Row]) -> Row | list[Row]:
        if inspect.iscoroutinefunction(spec.body):
            return await asyncio.wait_for(spec.body(arg, **kwargs), timeout_s)
        result = await run_blocking(lambda: spec.body(arg, **kwargs), timeout_s=timeout_s, what=what)
        return await asyncio.wait_for(result, timeout_s) if inspect.isawaitable(result) else result

    if spec.mode == "pointwise":
        if len(rows) != 1:
            raise ValueError("pointwise bodies take one row at a time")
        out = [await call(rows[0])]
    else:
        out = await call(list(rows))
        if not isinstance(out, list) or len(out) != len(rows):
            raise UnsupportedEvalError(
                f"{spec.qualified_name} ({spec.mode}) must return the list of rows it was given "
                f"({len(rows)}); it returned {type(out).__name__}"
                + (f" of length {len(out)}" if isinstance(out, list) else "")
            )
    wrong = [type(row).__name__ for row in out if not hasattr(row, "evaluation_result")]
    if wrong:
        raise UnsupportedEvalError(
            f"{spec.qualified_name} returned {wrong[0]} where eval-protocol expects the EvaluationRow it was given, "
            "with row.evaluation_result set (EvaluateResult(score=...)); return the row."
        )
    return out


def score_of(row: Row) -> float | None:
    """The eval's score for a scored row, or None when the body left it unscored, marked it invalid, or gave a
    score that is not a finite number (NaN or inf would make the whole batch's reward NaN)."""
    result = getattr(row, "evaluation_result", None)
    if result is None or getattr(result, "score", None) is None:
        return None
    if getattr(result, "is_score_valid", True) is False:
        return None
    score = float(result.score)
    return score if math.isfinite(score) else None


def pytest_outcome(exc: BaseException, what: str, eval_name: str) -> UnsupportedEvalError | None:
    """An eval's code that calls ``pytest.skip``/``fail``/``exit`` while training: one clear error, not a
    pytest outcome raised through the trainer."""
    try:
        from _pytest.outcomes import OutcomeException
    except ImportError:  # no pytest here: nothing of the kind can be raised
        return None
    if not isinstance(exc, OutcomeException):
        return None
    verb = {"Skipped": "skip", "Failed": "fail", "XFailed": "xfail"}.get(type(exc).__name__, type(exc).__name__)
    return UnsupportedEvalError(
        f"{eval_name}: its {what} called pytest.{verb}({str(exc)!r}) during training. Eval "
        "modules do this when an import they guard failed: the environment's package is probably not importable in "
        "this Python (import the eval module's environment client yourself to see the error)."
    )
