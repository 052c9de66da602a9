"""Score finished episodes with the eval's own body: per row, per prompt group, or over the whole batch.

Episodes that failed are never scored (their score is None, not 0). A body that raises leaves the rows it was
given unscored and records why; the other rows of the batch are unaffected.
"""

import asyncio
import logging
import math
from collections.abc import Sequence

from ..errors import UnsupportedEvalError
from ..evalprotocol.body import Scored, run_body, score_of
from ..evalprotocol.spec import EvalSpec
from ..trajectory.types import Prompt, Row

logger = logging.getLogger(__name__)


def group_indices(prompts: Sequence[Prompt], num_generations: int) -> list[list[int]]:
    """Consecutive indices of one prompt, at most ``num_generations`` long (TRL repeats each prompt that often)."""
    groups: list[list[int]] = []
    for i, prompt in enumerate(prompts):
        if groups and len(groups[-1]) < num_generations and prompts[groups[-1][0]] == prompt:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


#: Why a failed episode's row has no score: the body never sees it (``Scored(None, row, FAILED_EPISODE)``).
FAILED_EPISODE = "episode failed; not scored"


async def score_rows(spec: EvalSpec, rows: list[Row], timeout_s: float) -> list[Scored]:
    """Run the body over ``rows`` (finished episodes' rows, one prompt group or a whole call's) in the eval's mode:
    pointwise one row per body call, groupwise and ``all`` every row in one call; one ``Scored`` per row.

    A body that raises or outlasts ``timeout_s`` leaves its rows unscored, saying why; one that returns something
    other than its rows raises ``UnsupportedEvalError`` (every call would do the same)."""
    batches = [[i] for i in range(len(rows))] if spec.mode == "pointwise" else [list(range(len(rows)))]
    verdicts: dict[int, Scored] = {}

    async def score(batch: list[int]) -> None:
        try:
            out = await run_body(spec, [rows[i] for i in batch], timeout_s)
        except UnsupportedEvalError:
            raise
        except TimeoutError:
            message = (
                f"eval body did not return within {timeout_s:g} s (raise RolloutOptions(body_timeout_s=...) "
                "if it is just slow)"
            )
            logger.warning("%s: %s (rows %s left unscored)", spec.qualified_name, message, batch)
            for i in batch:
                verdicts[i] = Scored(None, rows[i], message)
            return
        except Exception as exc:
            message = f"eval body raised {type(exc).__name__}: {exc}"
            logger.warning("%s: %s (rows %s left unscored)", spec.qualified_name, message, batch)
            for i in batch:
                verdicts[i] = Scored(None, rows[i], message)
            return
        for i, row in zip(batch, out):
            value = score_of(row)
            verdicts[i] = Scored(value, row, None if value is not None else _unscored_reason(row))

    await asyncio.gather(*(score(b) for b in batches if b))
    return [verdicts[i] for i in range(len(rows))]


def _unscored_reason(row: Row) -> str:
    result = getattr(row, "evaluation_result", None)
    score = getattr(result, "score", None)
    if score is not None and not math.isfinite(float(score)):
        return f"eval body gave a score that is not a finite number ({score}); treated as unscored"
    if result is not None and getattr(result, "is_score_valid", True) is False:
        return "eval body marked the score invalid"
    return "eval body left the row unscored"
