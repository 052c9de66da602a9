"""Episodes of any other eval-protocol processor (``SingleTurnRolloutProcessor``, ``AgentRolloutProcessor``, ...):
the eval's own processor runs unchanged on the eval's own rows while ep_trl captures its model calls.

Per TRL prompt: the eval's row it stands for (``evalprotocol.match_rows``), a fresh rollout id, and a model name
that routes the processor's calls for that row to ep_trl's endpoint (``evalprotocol.processors``), where a
``RolloutCapture`` generates each reply with the trainer's backend and records the tokens. The row the processor
returns is the one the eval body scores; its last conversation segment is what TRL trains on.

An episode fails (as data) when its generation failed, when the processor raised from its environment or tools
(``environment``: connection, timeout and OS errors, MCP servers included) or from any other code of the eval
(``eval_code``), or when the processor marked the row's rollout as failed.
"""

import asyncio
import logging
import re
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Protocol

from ..capture.endpoint import MODEL_PREFIX, CaptureEndpoint, new_token
from ..capture.parsing import ToolCallParser
from ..capture.placement import RolloutCapture
from ..errors import ConfigError, UnsupportedEvalError
from ..evalprotocol import EvalSpec, check_rows, match_rows, mcp_gym, processors
from ..evalprotocol.body import pytest_outcome
from ..evalprotocol.mcp_servers import RolloutServers, StdioServers
from ..generation import Generator
from ..runtime.processes import port_holder
from ..traininglog.rows import RowContext
from ..traininglog.writer import RolloutLogWriter
from ..trajectory.episode import Episode, EpisodeFailure, EpisodePlan, FailureKind, ended_episode
from ..trajectory.types import Message, Messages, MessagesView, MessageView, Prompt, Row
from . import CallSetup, EpisodeRequest

logger = logging.getLogger(__name__)

#: Errors raised by a processor's environment side: its tools, MCP servers, sandboxes and their connections.
_ENVIRONMENT_ERRORS: tuple[type[BaseException], ...] = (OSError,)  # ConnectionError and TimeoutError among them
#: The same from libraries ep_trl does not import: httpx's transport errors and MCP's protocol error.
_ENVIRONMENT_ERROR_NAMES = (
    "ConnectError",
    "ConnectTimeout",
    "ReadError",
    "ReadTimeout",
    "RemoteProtocolError",
    "WriteError",
    "PoolTimeout",
    "McpError",
)
#: A server the processor starts found its port taken (eval-protocol's MCP-gym server says so in a RuntimeError).
_PORT_IN_USE = re.compile(r"[Pp]ort (\d+) is already in use")


class ProcessorSource:
    """Runs the eval's processor on the eval's rows, each prompt's calls captured by ep_trl's endpoint."""

    def __init__(self, spec: EvalSpec, rows: Sequence[Row]) -> None:
        assert spec.processor is not None
        self._spec = spec
        self._rows = list(rows)
        self._endpoint = CaptureEndpoint()
        self._variables = processors.RoutingVariables()
        self._parser: ToolCallParser | None = None
        self._mcp = StdioServers(spec.processor_settings.get("mcp_config_path"))
        if mcp_gym.is_mcp_gym(spec.processor) and (zero := mcp_gym.seed_zero_rows(self._rows)):
            logger.warning(
                "%s: %d row(s) have environment seed 0 (%s), which eval-protocol's MCP-gym server takes for "
                "no seed: each of their episodes plays a random environment, not the row's. Give those rows "
                "another seed.",
                spec.qualified_name,
                len(zero),
                ", ".join(zero[:5]),
            )

    def describe(self) -> str:
        return (
            f"{self._spec.processor_name} run unchanged on {len(self._rows)} eval rows, its model calls "
            "captured by ep_trl"
        )

    def check(self, prompts: Sequence[Prompt]) -> None:
        """Every prompt stands for one of the eval's rows (``evalprotocol.check_rows`` says which cannot; no row is
        copied: each episode takes its own copy when it starts)."""
        check_rows(prompts, self._rows, self._spec.qualified_name)

    @asynccontextmanager
    async def session(self, setup: "CallSetup") -> AsyncIterator["_ProcessorPlayer"]:
        """The endpoint (started on first use) with a routing key of this session: a processor's calls with
        an earlier session's key are refused."""
        spec = self._spec
        if not self._endpoint.running:
            await self._endpoint.start()
            processors.setup(spec)
        assert self._endpoint.base_url is not None
        key = self._endpoint.new_call()
        self._variables.point_at(self._endpoint.base_url, key)
        if self._parser is None:
            self._parser = ToolCallParser(setup.template.tokenizer)
        yield _ProcessorPlayer(self, setup, asyncio.Semaphore(spec.max_concurrent_rollouts), key)

    async def aclose(self) -> None:
        try:
            if self._endpoint.running:
                await processors.cleanup(self._spec)
        finally:
            await self._endpoint.aclose()
            self._variables.restore()
            self._mcp.close()

    async def _episode(
        self, setup: "CallSetup", request: EpisodeRequest, generator: Generator, semaphore: asyncio.Semaphore, key: str
    ) -> tuple[Episode, Row]:
        """One row through the processor; the episode and the row for the body."""
        assert self._parser is not None and self._endpoint.base_url is not None
        rollout_id, prompt, context = request.rollout_id, request.prompt, request.context
        row = match_rows([prompt], self._rows, self._spec.qualified_name)[0]
        plan = EpisodePlan(
            index=request.index,
            group=request.group,
            member=request.member,
            task=None,
            initial_messages=tuple(_message_dicts(row.messages)),
        )
        label = f"episode {plan.index} (row {row.input_metadata.row_id})"
        capture = RolloutCapture(new_token(), label, setup.limits, setup.template, generator, self._parser)
        live = _LiveLog(setup.log, context, plan, rollout_id, prompt)
        params = processors.routed_params(
            self._spec.completion_params, MODEL_PREFIX + capture.token, self._endpoint.base_url, key
        )
        context.row(plan, rollout_id, prompt, (), (), source_row=row)  # the processor logs it with our ids
        live.log(row)
        self._endpoint.add(capture)
        mcp = self._mcp.for_rollout(rollout_id)
        start = time.perf_counter()
        failure: EpisodeFailure | None = None
        try:
            row = await processors.run_row(self._spec, row, params, semaphore, live, mcp.config_path)
        except (ConfigError, UnsupportedEvalError):
            raise
        except Exception as exc:
            outcome = pytest_outcome(exc, "rollout processor", self._spec.qualified_name)
            if outcome is not None:
                raise outcome from exc
            cause = _cause(exc)
            kind = _kind(cause)
            failure = capture.failure or EpisodeFailure(
                kind, cause, _environment_detail(cause, mcp) if kind == "environment" else None
            )
        finally:
            self._endpoint.remove(capture.token)
            self._mcp.discard(mcp)
        if capture.fatal is not None:
            raise capture.fatal
        self._check_routed(capture)
        failure = failure or capture.failure or _reported_failure(row)
        if failure is None and capture.calls == 0:
            raise UnsupportedEvalError(
                f"{self._spec.qualified_name}: {self._spec.processor_name} finished a row without calling the model "
                "through ep_trl. ep_trl routes each row's calls by its model name (completion_params['model'], set to "
                f"'{processors.model_alias(MODEL_PREFIX + '<token>')}'); a processor that calls another model or "
                "client is not trainable this way (docs/processors.md)."
            )
        if failure is not None:
            logger.warning("%s failed (%s): %s", label, failure.kind, failure)
        messages = tuple(_message_dicts(row.messages))
        fallback = list(plan.initial_messages)
        await capture.prepare_fallback(fallback)  # rendered if no call was placed: its images in a thread
        episode = ended_episode(
            plan,
            failure,
            capture.stop_reason,
            trajectory=capture.trajectory(fallback),
            messages=messages,
            step_rewards=(),
            actions=tuple(_tool_calls(messages)),
            turns=tuple(capture.turns),
            duration_s=time.perf_counter() - start,
            prompt_tokens=capture.prompt_tokens,
            budget_blocked_tokens=capture.budget_blocked_tokens,
            forked_segments=capture.forks,
        )
        return episode, context.episode_row(episode, rollout_id, prompt, source_row=row)

    def _check_routed(self, capture: RolloutCapture) -> None:
        """Raise when the processor called no model through ep_trl because its client ignored the row's key or
        model (every row would fail alike)."""
        if capture.calls == 0 and capture.unauthorized:
            raise UnsupportedEvalError(
                f"{self._spec.qualified_name}: {self._spec.processor_name} called the model ep_trl gave the row "
                "without the key ep_trl gave it with (answered 401): build the model client from the row's or the "
                "config's completion_params, api_key included (LiteLLM does; an OpenAI client needs "
                "api_key=completion_params['api_key']). The key keeps other local processes out of the rollout "
                "(docs/processors.md)."
            )
        if capture.calls == 0 and self._endpoint.unknown_models:
            raise UnsupportedEvalError(
                f"{self._spec.qualified_name}: {self._spec.processor_name} called ep_trl's endpoint with the model "
                f"{sorted(set(self._endpoint.unknown_models))} instead of the one ep_trl gave the row "
                f"('{processors.model_alias(MODEL_PREFIX + '<token>')}', with api_base): build the model client "
                "from the row's or the config's completion_params (docs/processors.md)."
            )


class _ProcessorPlayer:
    def __init__(self, source: ProcessorSource, setup: "CallSetup", semaphore: asyncio.Semaphore, key: str) -> None:
        self._source, self._setup, self._semaphore, self._key = source, setup, semaphore, key

    @property
    def env_sessions(self) -> int:
        return 0  # the processor's environment is its own

    async def play(self, request: EpisodeRequest, generator: Generator) -> tuple[Episode, Row]:
        return await self._source._episode(self._setup, request, generator, self._semaphore, self._key)


class _LiveLog:
    """The DatasetLogger handed to the processor: its mid-rollout rows go to ``ep logs`` with the training ids (or
    nowhere when logging is off)."""

    def __init__(
        self, log: RolloutLogWriter | None, context: RowContext, plan: EpisodePlan, rollout_id: str, prompt: Prompt
    ) -> None:
        self._log, self._context, self._plan, self._rollout_id, self._prompt = log, context, plan, rollout_id, prompt

    def log(self, row: Row) -> None:
        if self._log is None:
            return
        snapshot = row.model_copy(deep=True)  # the processor goes on changing its row
        context, plan = self._context, self._plan
        self._log.log(
            self._rollout_id, lambda: context.row(plan, self._rollout_id, self._prompt, (), (), source_row=snapshot)
        )

    def read(self, rollout_id: str | None = None) -> list[Row]:
        return []


def _cause(exc: BaseException) -> BaseException:
    """The error inside the exception groups that MCP clients and task groups wrap errors in (the first one)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _kind(exc: BaseException) -> FailureKind:
    """``environment`` for connection, timeout and OS errors (HTTP clients' and MCP's included) and a server port
    that is taken, else ``eval_code``."""
    seen = [exc, exc.__cause__] if exc.__cause__ is not None else [exc]
    for error in seen:
        if isinstance(error, _ENVIRONMENT_ERRORS) or type(error).__name__ in _ENVIRONMENT_ERROR_NAMES:
            return "environment"
        if _PORT_IN_USE.search(str(error)):
            return "environment"
    return "eval_code"


def _environment_detail(exc: BaseException, mcp: RolloutServers) -> str | None:
    """What ep_trl can add to an environment error: who holds a port the processor's server could not take (a
    server left behind by a killed run, say), and what the rollout's stdio MCP servers said before they died."""
    found = _PORT_IN_USE.search(str(exc))
    held = None
    if found:
        port = int(found.group(1))
        holder = port_holder(port)
        held = (
            f"port {port} is held by {holder}: stop it if no run needs it (another run's server, or one left "
            "by a run that ep_trl did not drive; a killed ep_trl run's ends within seconds) or give the eval's "
            "server another port"
            if holder
            else f"port {port} is held by a process this user cannot see: free the port or give the server another"
        )
    return "; ".join(part for part in (held, mcp.stderr_summary()) if part) or None


def _reported_failure(row: Row) -> EpisodeFailure | None:
    """A processor that catches its own errors marks the row's rollout status instead of raising: any code but
    OK, RUNNING (never set) and FINISHED is a failure (eval-protocol's ``is_error`` only means INTERNAL)."""
    from eval_protocol.models import Status

    status = getattr(row, "rollout_status", None)
    fine = (Status.Code.OK, Status.Code.RUNNING, Status.Code.FINISHED)
    if status is None or status.code in fine:
        return None
    return EpisodeFailure(
        "eval_code", RuntimeError(f"the processor marked the rollout {Status.Code(status.code).name}: {status.message}")
    )


class _MessageModel(Protocol):
    """eval-protocol's ``Message`` (a pydantic model), as far as a row's messages are read."""

    def model_dump(self, *, exclude_none: bool) -> Message: ...


def _message_dicts(messages: Sequence[_MessageModel | MessageView]) -> Messages:
    return [m.model_dump(exclude_none=True) if hasattr(m, "model_dump") else dict(m) for m in messages]


def _tool_calls(messages: MessagesView) -> list[str]:
    """The tools the model called, in order (the episode's actions)."""
    return [
        str((call.get("function") or {}).get("name"))
        for m in messages
        if m.get("role") == "assistant"
        for call in m.get("tool_calls") or []
    ]
