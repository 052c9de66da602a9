"""A user-written processor that rewrites history: it drafts an answer, then asks again from a conversation that
replaces the draft with a summary of it (a common "reflect" pattern). The second call does not extend the first."""

import asyncio

import litellm
from eval_protocol.models import EvaluateResult, EvaluationRow, Message
from eval_protocol.pytest import evaluation_test
from eval_protocol.pytest.rollout_processor import RolloutProcessor
from eval_protocol.pytest.types import RolloutProcessorConfig


class DraftThenReviseProcessor(RolloutProcessor):
    def __call__(self, rows: list[EvaluationRow], config: RolloutProcessorConfig) -> list[asyncio.Task[EvaluationRow]]:
        async def process(row: EvaluationRow) -> EvaluationRow:
            params = dict(config.completion_params)
            model = params.pop("model")
            messages = [m.dump_mdoel_for_chat_completion_request() for m in row.messages]
            draft = await litellm.acompletion(model=model, messages=messages, **params)
            draft_text = draft.choices[0].message.content or ""
            revised = [
                messages[0],
                {"role": "user", "content": f"Summary of your first draft: {draft_text[:20]!r}. Answer again."},
            ]
            final = await litellm.acompletion(model=model, messages=revised, **params)
            row.messages = [Message(**m) for m in revised] + [
                Message(role="assistant", content=final.choices[0].message.content or "")
            ]
            return row

        async def bounded(row: EvaluationRow) -> EvaluationRow:
            async with config.semaphore:
                return await process(row)

        return [asyncio.create_task(bounded(row)) for row in rows]


@evaluation_test(
    input_messages=[[[Message(role="system", content="Be brief."), Message(role="user", content="Name a colour.")]]],
    completion_params=[{"model": "fireworks_ai/accounts/fireworks/models/qwen3-8b", "max_tokens": 12}],
    rollout_processor=DraftThenReviseProcessor(),
    mode="pointwise",
)
def test_draft_then_revise(row: EvaluationRow) -> EvaluationRow:
    """Brief is better: ``1 / (1 + characters)`` for a non-empty final answer, 0.0 for none (answers of different
    lengths score differently, so a group's rewards give GRPO something to learn from)."""
    answer = row.messages[-1].content or ""
    row.evaluation_result = EvaluateResult(
        score=1.0 / (1 + len(answer)) if answer else 0.0, reason=f"answered in {len(answer)} characters"
    )
    return row
