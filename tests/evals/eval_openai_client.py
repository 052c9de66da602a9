"""User-written processors that call the model with the OpenAI client instead of LiteLLM, as LangGraph and
PydanticAI factories do: one builds its client from the config's completion params (routed), one calls a fixed
model (not routed: ep_trl says so)."""

import asyncio

from eval_protocol.models import EvaluateResult, EvaluationRow, Message
from eval_protocol.pytest import evaluation_test
from eval_protocol.pytest.rollout_processor import RolloutProcessor
from eval_protocol.pytest.types import RolloutProcessorConfig
from openai import AsyncOpenAI


class OpenAIClientProcessor(RolloutProcessor):
    def __init__(self, fixed_model: str | None = None) -> None:
        self.fixed_model = fixed_model

    def __call__(self, rows: list[EvaluationRow], config: RolloutProcessorConfig) -> list[asyncio.Task[EvaluationRow]]:
        async def process(row: EvaluationRow) -> EvaluationRow:
            params = config.completion_params
            client = AsyncOpenAI(base_url=params.get("api_base"), api_key=params.get("api_key"))
            reply = await client.chat.completions.create(
                model=self.fixed_model or params["model"],
                max_tokens=params.get("max_tokens", 8),
                messages=[m.dump_mdoel_for_chat_completion_request() for m in row.messages],
            )
            row.messages.append(Message(role="assistant", content=reply.choices[0].message.content or ""))
            return row

        return [asyncio.create_task(process(row)) for row in rows]


MESSAGES = [[[Message(role="user", content="Say hi.")]]]
PARAMS = [{"model": "fireworks_ai/accounts/fireworks/models/qwen3-8b", "max_tokens": 8}]


@evaluation_test(
    input_messages=MESSAGES, completion_params=PARAMS, rollout_processor=OpenAIClientProcessor(), mode="pointwise"
)
def test_routed_client(row: EvaluationRow) -> EvaluationRow:
    row.evaluation_result = EvaluateResult(score=1.0, reason="answered")
    return row


@evaluation_test(
    input_messages=MESSAGES,
    completion_params=PARAMS,
    rollout_processor=OpenAIClientProcessor(fixed_model="gpt-4o-mini"),
    mode="pointwise",
)
def test_fixed_model(row: EvaluationRow) -> EvaluationRow:
    row.evaluation_result = EvaluateResult(score=1.0, reason="answered")
    return row


@evaluation_test(
    input_messages=MESSAGES,
    completion_params=[{"model": {"planner": "a", "writer": "b"}}],
    rollout_processor=OpenAIClientProcessor(),
    mode="pointwise",
)
def test_two_models(row: EvaluationRow) -> EvaluationRow:
    """eval-protocol's multi-agent pattern: one model per role."""
    row.evaluation_result = EvaluateResult(score=1.0, reason="answered")
    return row
