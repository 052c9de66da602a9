"""The one seam to eval-protocol: read an eval test's configuration, build rows, run its body.

eval-protocol keeps its ``OpenEnvRolloutProcessor`` settings in private attributes. They are read here and
nowhere else, each through ``_private`` so that a rename in a new eval-protocol release fails at
construction with a message naming the attribute (``tests/test_evalprotocol.py`` pins the names).
"""

import asyncio
import inspect
import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .environment import EnvSettings
from .errors import UnsupportedEvalError
from .evaltest import EvalTest
from .versions import require_range

logger = logging.getLogger(__name__)

SUPPORTED_EVAL_PROTOCOL = ("0.3.33", "0.4")
EVAL_MODES = ("pointwise", "groupwise", "all")


@dataclass(frozen=True)
class EvalSpec:
    """Everything the bridge takes from one eval test, before the caller's overrides."""

    name: str
    qualified_name: str
    mode: str
    body: Callable[..., Any]
    evaluation_test_kwargs: Mapping[str, Any]
    completion_params: Mapping[str, Any]
    max_steps: int
    max_concurrent_rollouts: int
    prompt_builder: Callable[[Any, int, list[str]], Any]
    action_parser: Callable[[str], Any]
    env: EnvSettings
    notes: tuple[str, ...] = field(default=())


def check_version() -> None:
    require_range("eval-protocol", *SUPPORTED_EVAL_PROTOCOL)


def _private(obj: object, name: str) -> Any:
    if not hasattr(obj, name):
        from .versions import installed_version

        raise UnsupportedEvalError(
            f"{type(obj).__name__} has no attribute {name!r} in eval-protocol {installed_version('eval-protocol')}; "
            f"ep_trl reads it to reuse the eval's environment settings and supports eval-protocol "
            f">={SUPPORTED_EVAL_PROTOCOL[0]},<{SUPPORTED_EVAL_PROTOCOL[1]}."
        )
    return getattr(obj, name)


def read_eval_spec(eval_test: EvalTest) -> EvalSpec:
    """Extract the eval's processor, prompt builder, parser, tasks, limits and scoring body."""
    from eval_protocol.pytest.openenv_rollout_processor import OpenEnvRolloutProcessor

    params = eval_test.wrapper.__ep_params__
    processor = params.rollout_processor
    if not isinstance(processor, OpenEnvRolloutProcessor):
        kind = type(processor).__name__ if processor is not None else "no rollout_processor"
        raise UnsupportedEvalError(
            f"{eval_test.qualified_name} uses {kind}; ep_trl trains through OpenEnvRolloutProcessor only "
            "(the environment loop it drives is what training replays). Give the eval "
            "rollout_processor=OpenEnvRolloutProcessor(...) or point env_path at an eval that has one."
        )
    mode = str(params.mode)
    if mode not in EVAL_MODES:
        raise UnsupportedEvalError(f"{eval_test.qualified_name} has mode {mode!r}; supported modes: {EVAL_MODES}.")
    body = getattr(eval_test.wrapper, "_origin_func", None)
    if not callable(body):
        raise UnsupportedEvalError(
            f"{eval_test.qualified_name} carries no _origin_func in eval-protocol; cannot reach the eval body."
        )

    notes: list[str] = []
    completion_params = _first_setting(params.completion_params, "completion_params", eval_test, notes)
    test_kwargs = _first_setting(params.evaluation_test_kwargs, "evaluation_test_kwargs", eval_test, notes)
    for reserved in ("row", "rows"):
        if reserved in test_kwargs:
            raise UnsupportedEvalError(f"{eval_test.qualified_name}: evaluation_test_kwargs may not contain {reserved!r}.")

    if _private(processor, "_hub_repo_id") and _private(processor, "_provided_env_factory") is None \
            and not _private(processor, "_env_base_url"):
        raise UnsupportedEvalError(
            f"{eval_test.qualified_name} launches its environment from the Hugging Face hub, which ep_trl does not do. "
            "Start the environment server yourself and pass env_base_url=... (or give the eval an env_factory)."
        )
    env = EnvSettings(
        factory=_private(processor, "_provided_env_factory"),
        client_cls=_private(processor, "_env_client_cls"),
        base_url=_private(processor, "_env_base_url"),
        request_timeout_s=float(_private(processor, "_request_timeout_s")),
        default_headers=_private(processor, "_default_headers"),
        tasks=tuple(str(t) for t in (_private(processor, "_tasks") or ())),
        task_var=_private(processor, "_task_var"),
        env_vars=dict(_private(processor, "_env_vars") or {}),
        docker_image=_private(processor, "_docker_image"),
    )
    return EvalSpec(
        name=eval_test.name,
        qualified_name=eval_test.qualified_name,
        mode=mode,
        body=body,
        evaluation_test_kwargs=test_kwargs,
        completion_params=completion_params,
        max_steps=int(params.steps),
        max_concurrent_rollouts=int(params.max_concurrent_rollouts),
        prompt_builder=processor.prompt_builder,
        action_parser=processor.action_parser,
        env=env,
        notes=tuple(notes),
    )


def _first_setting(values: Any, what: str, eval_test: EvalTest, notes: list[str]) -> dict[str, Any]:
    """eval-protocol parametrizes over lists of settings; training uses the first one and says so."""
    if values is None:
        return {}
    if isinstance(values, Mapping):
        return dict(values)
    entries = [dict(v) for v in values if v is not None]
    if len(entries) > 1:
        notes.append(
            f"{eval_test.qualified_name} lists {len(entries)} {what}; training uses the first: {entries[0]!r}."
        )
    return entries[0] if entries else {}


def history_line(step: int, action: Any, reward: float, observation: Any) -> str:
    """The history entry OpenEnvRolloutProcessor gives prompt builders, reproduced so prompts match the eval."""
    label = getattr(action, "action_str", None) or str(action)
    error_flag = getattr(observation, "last_action_error", False)
    return f"Step {step}: {label} -> reward {reward:+.2f}{' ERROR' if error_flag else ''}"


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def build_row(
    *,
    messages: Sequence[Mapping[str, Any]],
    eval_name: str,
    row_id: str,
    rollout_id: str,
    invocation_id: str,
    experiment_id: str,
    run_id: str,
    completion_params: Mapping[str, Any],
    extra: Mapping[str, Any],
    usage: Mapping[str, int] | None = None,
    duration_s: float | None = None,
) -> Any:
    """An ``EvaluationRow`` shaped like the one OpenEnvRolloutProcessor hands the eval body."""
    from eval_protocol.models import EvalMetadata, EvaluationRow, InputMetadata, Message

    row = EvaluationRow(
        messages=[Message(**dict(m)) for m in messages],
        input_metadata=InputMetadata(row_id=row_id, completion_params=dict(completion_params)),
        eval_metadata=EvalMetadata(name=eval_name, version="ep_trl", status=None, num_runs=1,
                                   aggregation_method="mean", passed_threshold=None, passed=None),
    )
    meta = row.execution_metadata
    meta.rollout_id = rollout_id
    meta.invocation_id = invocation_id
    meta.experiment_id = experiment_id
    meta.run_id = run_id
    meta.extra = dict(extra)
    if usage is not None:
        from openai.types import CompletionUsage

        meta.usage = CompletionUsage(**usage)
    if duration_s is not None:
        meta.rollout_duration_seconds = duration_s
    return row


async def run_body(spec: EvalSpec, rows: list[Any]) -> list[Any]:
    """Run the eval body as eval-protocol would: per row (pointwise) or on the list (groupwise, all).

    Sync bodies run in a worker thread so a slow scorer does not stall the episodes still in flight.
    """
    kwargs = dict(spec.evaluation_test_kwargs)

    async def call(arg: Any) -> Any:
        if inspect.iscoroutinefunction(spec.body):
            return await spec.body(arg, **kwargs)
        result = await asyncio.to_thread(spec.body, arg, **kwargs)
        return await result if inspect.isawaitable(result) else result

    if spec.mode == "pointwise":
        if len(rows) != 1:
            raise ValueError("pointwise bodies take one row at a time")
        return [await call(rows[0])]
    out = await call(list(rows))
    if not isinstance(out, list) or len(out) != len(rows):
        raise UnsupportedEvalError(
            f"{spec.qualified_name} ({spec.mode}) must return the list of rows it was given "
            f"({len(rows)}); it returned {type(out).__name__}"
            + (f" of length {len(out)}" if isinstance(out, list) else "")
        )
    return out


def score_of(row: Any) -> float | None:
    """The eval's score for a scored row, or None when the body left it unscored or invalid."""
    result = getattr(row, "evaluation_result", None)
    if result is None or getattr(result, "score", None) is None:
        return None
    if getattr(result, "is_score_valid", True) is False:
        return None
    return float(result.score)


def dataset_messages(eval_test: EvalTest) -> list[list[dict[str, Any]]]:
    """The eval's own dataset as chat messages, one list per row, from the first of its parametrized inputs."""
    params = eval_test.wrapper.__ep_params__
    if params.input_messages:
        rows = [list(messages) for messages in params.input_messages[0]]
    elif params.input_rows:
        rows = [list(row.messages) for row in params.input_rows[0]]
    elif params.input_dataset:
        from eval_protocol.common_utils import load_jsonl

        records: list[dict[str, Any]] = []
        paths = params.input_dataset if isinstance(params.input_dataset, (list, tuple)) else [params.input_dataset]
        for path in paths:
            records.extend(load_jsonl(path))
        rows = [list(row.messages) for row in params.dataset_adapter(records)]
    else:
        raise UnsupportedEvalError(
            f"{eval_test.qualified_name} has no input_messages, input_rows or input_dataset (data_loaders are not "
            "read by ep_trl); build the training dataset yourself with a 'prompt' column of messages."
        )
    if params.max_dataset_rows:
        rows = rows[: params.max_dataset_rows]
    return [[_message_dict(m) for m in messages] for messages in rows]


def _message_dict(message: Any) -> dict[str, Any]:
    if isinstance(message, Mapping):
        return {"role": message["role"], "content": message.get("content", "")}
    return {"role": message.role, "content": message.content}
