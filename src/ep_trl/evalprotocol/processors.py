"""Running an eval's own rollout processor on one row, the way ``evaluation_test`` does, with its model calls routed
to ep_trl's endpoint.

Routing. Processors call the model through LiteLLM, but read different settings: ``SingleTurnRolloutProcessor``
passes the config's ``completion_params`` (``api_base`` included) to every call, ``AgentRolloutProcessor`` uses the
row's ``completion_params["model"]`` and nothing else. The one setting every processor honours is the model name,
so each row gets its own: ``hosted_vllm/ep-trl/<token>``. LiteLLM's ``hosted_vllm`` provider needs no API key and
takes its base URL from ``api_base`` or ``HOSTED_VLLM_API_BASE``; ep_trl sets both, the variable for as long as the
rollout function is open (it affects only models named ``hosted_vllm/...``). A new name per rollout also keeps
requests out of the response cache AgentRolloutProcessor turns on for the whole process.
"""

import asyncio
import logging
import os
from collections.abc import Mapping
from typing import Any

from .spec import EvalSpec

logger = logging.getLogger(__name__)

#: LiteLLM's OpenAI-compatible provider that needs no API key; the variable it reads its base URL from.
PROVIDER = "hosted_vllm"
BASE_URL_VARIABLE = "HOSTED_VLLM_API_BASE"

#: completion_params keys, besides ``model``, that would send the call elsewhere or change how it is made; removed
#: from what the processor gets (``api_base`` is set anew).
ROUTING_KEYS = ("api_base", "base_url", "api_key", "stream", "custom_llm_provider", "n")


def model_alias(model_name: str) -> str:
    """The LiteLLM model name that routes one rollout's calls to ep_trl's endpoint."""
    return f"{PROVIDER}/{model_name}"


def routed_params(params: Mapping[str, Any], model_name: str, base_url: str) -> dict[str, Any]:
    """The eval's completion params with the model call sent to ep_trl's endpoint for one rollout."""
    kept = {k: v for k, v in params.items() if k != "model" and k not in ROUTING_KEYS}
    return {**kept, "model": model_alias(model_name), "api_base": base_url}


class BaseUrlVariable:
    """``HOSTED_VLLM_API_BASE`` pointed at the endpoint while training, then put back as it was."""

    def __init__(self) -> None:
        self._saved: str | None = None
        self._set = False

    def point_at(self, base_url: str) -> None:
        if self._set:
            return
        self._saved = os.environ.get(BASE_URL_VARIABLE)
        if self._saved and self._saved != base_url:
            logger.warning("%s was %s; while ep_trl trains it points at %s, so any other hosted_vllm model the eval "
                           "calls (a judge, say) must pass its own api_base.", BASE_URL_VARIABLE, self._saved, base_url)
        os.environ[BASE_URL_VARIABLE] = base_url
        self._set = True

    def restore(self) -> None:
        if not self._set:
            return
        if self._saved is None:
            os.environ.pop(BASE_URL_VARIABLE, None)
        else:
            os.environ[BASE_URL_VARIABLE] = self._saved
        self._set = False


def setup(spec: EvalSpec) -> None:
    """The processor's ``setup()``, as ``evaluation_test`` calls it once per invocation."""
    spec.processor.setup()


async def cleanup(spec: EvalSpec) -> None:
    """The processor's async and sync cleanup."""
    await spec.processor.acleanup()
    spec.processor.cleanup()


async def run_row(spec: EvalSpec, row: Any, params: Mapping[str, Any], semaphore: asyncio.Semaphore,
                  dataset_logger: Any) -> Any:
    """One row through the eval's processor with ``params`` as its completion params (the config and the row carry
    the same ones, as ``evaluation_test`` sets them); returns the row the processor finished with."""
    from eval_protocol.pytest.types import RolloutProcessorConfig

    settings = spec.processor_settings
    row.input_metadata.completion_params = dict(params)
    config = RolloutProcessorConfig(
        completion_params=dict(params),
        mcp_config_path=settings.get("mcp_config_path") or "",
        server_script_path=settings.get("server_script_path"),
        steps=spec.max_steps,
        logger=dataset_logger,
        semaphore=semaphore,
        kwargs=dict(settings.get("kwargs") or {}),
    )
    tasks = spec.processor([row], config)
    if len(tasks) != 1:
        raise RuntimeError(f"{spec.processor_name} returned {len(tasks)} tasks for one row")
    return await tasks[0]
