"""Fault injection (a fake, named as such): a user-written processor that calls the model as a real one does,
then raises on the rows that ask it to fail, and marks the rollout NOT_FOUND on the rows that ask it to report
(as processors that catch their own errors do); the other rows finish normally."""

import asyncio

import litellm
from eval_protocol.models import EvaluateResult, EvaluationRow, Message, Status
from eval_protocol.pytest import evaluation_test
from eval_protocol.pytest.rollout_processor import RolloutProcessor
from eval_protocol.pytest.types import RolloutProcessorConfig


class FaultyProcessor(RolloutProcessor):
    def __call__(self, rows: list[EvaluationRow], config: RolloutProcessorConfig) -> list[asyncio.Task[EvaluationRow]]:
        async def process(row: EvaluationRow) -> EvaluationRow:
            params = dict(config.completion_params)
            model = params.pop("model")
            messages = [m.dump_mdoel_for_chat_completion_request() for m in row.messages]
            reply = await litellm.acompletion(model=model, messages=messages, **params)
            if "fail" in (row.messages[-1].content or ""):
                raise ValueError("the processor's own parsing failed (fault injection)")
            if "report" in (row.messages[-1].content or ""):
                row.rollout_status = Status(code=Status.Code.NOT_FOUND, message="no remote data (fault injection)")
            row.messages.append(Message(role="assistant", content=reply.choices[0].message.content or ""))
            return row

        return [asyncio.create_task(process(row)) for row in rows]


@evaluation_test(
    input_messages=[
        [
            [Message(role="user", content="Say hi.")],
            [Message(role="user", content="Say hi, then fail.")],
            [Message(role="user", content="Say hi, then report.")],
        ]
    ],
    completion_params=[{"model": "fireworks_ai/accounts/fireworks/models/qwen3-8b", "max_tokens": 8}],
    rollout_processor=FaultyProcessor(),
    mode="pointwise",
)
def test_faulty_processor(row: EvaluationRow) -> EvaluationRow:
    row.evaluation_result = EvaluateResult(score=1.0, reason="finished")
    return row
