"""Running an eval's own rollout processor on one row, the way ``evaluation_test`` does, with its model calls routed
to ep_trl's endpoint.

Routing. Processors call the model through LiteLLM, but read different settings: ``SingleTurnRolloutProcessor``
passes the config's ``completion_params`` (``api_base`` included) to every call, ``AgentRolloutProcessor`` uses the
row's ``completion_params["model"]`` and nothing else. The one setting every processor honours is the model name,
so each row gets its own: ``hosted_vllm/ep-trl/<token>``. LiteLLM's ``hosted_vllm`` provider takes its base URL from
``api_base`` or ``HOSTED_VLLM_API_BASE`` and its key from ``api_key`` or ``HOSTED_VLLM_API_KEY``; ep_trl sets all
four (the variables for as long as the rollout function is open; they affect only models named ``hosted_vllm/...``),
the key being the endpoint's per-call key (``ep_trl.capture.endpoint``). A new name per rollout also keeps
requests out of the response cache AgentRolloutProcessor turns on for the whole process.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import Counter
from typing import TYPE_CHECKING

from ..trajectory.types import Row, Settings
from . import mcp_gym
from .mcp_servers import watching_started_servers
from .spec import EvalSpec
from .store import DatasetLogger

if TYPE_CHECKING:  # eval-protocol ships no types: to the checker the name documents what is held
    from eval_protocol.pytest.rollout_processor import RolloutProcessor

logger = logging.getLogger(__name__)

#: LiteLLM's OpenAI-compatible provider; the variables it reads its base URL and its key from.
PROVIDER = "hosted_vllm"
BASE_URL_VARIABLE = "HOSTED_VLLM_API_BASE"
KEY_VARIABLE = "HOSTED_VLLM_API_KEY"

#: completion_params keys, besides ``model``, that would send the call elsewhere or change how it is made; removed
#: from what the processor gets (``api_base`` is set anew).
ROUTING_KEYS = ("api_base", "base_url", "api_key", "stream", "custom_llm_provider", "n")


def model_alias(model_name: str) -> str:
    """The LiteLLM model name that routes one rollout's calls to ep_trl's endpoint."""
    return f"{PROVIDER}/{model_name}"


def routed_params(params: Settings, model_name: str, base_url: str, api_key: str) -> dict[str, object]:
    """The eval's completion params with the model call sent to ep_trl's endpoint for one rollout."""
    kept = {k: v for k, v in params.items() if k != "model" and k not in ROUTING_KEYS}
    return {**kept, "model": model_alias(model_name), "api_base": base_url, "api_key": api_key}


class RoutingVariables:
    """``HOSTED_VLLM_API_BASE`` and ``HOSTED_VLLM_API_KEY`` pointed at the endpoint while training (the key renewed
    with every rollout call), then put back as they were."""

    def __init__(self) -> None:
        self._saved: dict[str, str | None] = {}

    def point_at(self, base_url: str, api_key: str) -> None:
        if not self._saved:
            self._saved = {name: os.environ.get(name) for name in (BASE_URL_VARIABLE, KEY_VARIABLE)}
            before = self._saved[BASE_URL_VARIABLE]
            if before and before != base_url:
                logger.warning(
                    "%s was %s; while ep_trl trains it points at %s (and %s holds ep_trl's key), so any "
                    "other hosted_vllm model the eval calls (a judge, say) must pass its own api_base and "
                    "api_key.",
                    BASE_URL_VARIABLE,
                    before,
                    base_url,
                    KEY_VARIABLE,
                )
        os.environ[BASE_URL_VARIABLE] = base_url
        os.environ[KEY_VARIABLE] = api_key

    def restore(self) -> None:
        for name, value in self._saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        self._saved = {}


def _processor(spec: EvalSpec) -> RolloutProcessor:
    """The eval's own processor; OpenEnv evals have none and never come here."""
    assert spec.processor is not None, f"{spec.qualified_name} has no processor of its own to run"
    return spec.processor


#: MCP-gym processors set up and not cleaned up yet (by ``id``), each as often as it was: their sessions start on
#: their row's seed (``mcp_gym``) meanwhile.
_seeding: Counter[int] = Counter()


def setup(spec: EvalSpec) -> None:
    """The processor's ``setup()``, as ``evaluation_test`` calls it once per invocation; once it succeeded, an MCP-gym
    processor's sessions start on their row's seed until :func:`cleanup` (``mcp_gym``)."""
    processor = _processor(spec)
    processor.setup()
    if mcp_gym.is_mcp_gym(processor):
        mcp_gym.start_seeded_sessions()
        _seeding[id(processor)] += 1


async def cleanup(spec: EvalSpec) -> None:
    """The processor's async and sync cleanup (also after a ``setup()`` that raised, as ``evaluation_test`` does)."""
    processor = _processor(spec)
    try:
        await processor.acleanup()
        processor.cleanup()
    finally:
        if _seeding[id(processor)] > 0:
            _seeding[id(processor)] -= 1
            mcp_gym.stop_seeded_sessions()


async def run_row(
    spec: EvalSpec,
    row: Row,
    params: Settings,
    semaphore: asyncio.Semaphore,
    dataset_logger: DatasetLogger,
    mcp_config_path: str | None,
) -> Row:
    """One row through the eval's processor with ``params`` as its completion params (the config and the row carry
    the same ones, as ``evaluation_test`` sets them) and the rollout's copy of the eval's MCP config
    (``mcp_servers``); returns the row the processor finished with. A server the processor starts with eval-protocol's
    ``MCPServerManager`` is handed to a watchdog as it starts (``mcp_servers.watching_started_servers``)."""
    from eval_protocol.pytest.types import RolloutProcessorConfig

    settings = spec.processor_settings
    row.input_metadata.completion_params = dict(params)
    config = RolloutProcessorConfig(
        completion_params=dict(params),
        mcp_config_path=mcp_config_path,
        server_script_path=settings.get("server_script_path"),
        steps=spec.max_steps,
        logger=dataset_logger,
        semaphore=semaphore,
        kwargs=dict(settings.get("kwargs") or {}),
    )
    with watching_started_servers():  # the server an MCP-gym processor starts in its call ends with the trainer
        tasks = _processor(spec)([row], config)
    if len(tasks) != 1:
        raise RuntimeError(f"{spec.processor_name} returned {len(tasks)} tasks for one row")
    return await tasks[0]
