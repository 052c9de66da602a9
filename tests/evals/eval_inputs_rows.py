"""A single-turn QA eval fed by ``input_rows``: ground truths, two identical rows, a tool-call history, and two rows
with the same question but different ground truths."""

from eval_protocol.models import EvaluateResult, EvaluationRow, InputMetadata, Message
from eval_protocol.pytest import SingleTurnRolloutProcessor, evaluation_test

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "weather",
        "description": "Today's weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}

ROWS = [
    EvaluationRow(messages=[Message(role="user", content="What is 2 + 2?")], ground_truth="4"),
    EvaluationRow(messages=[Message(role="user", content="What is 2 + 2?")], ground_truth="4"),
    EvaluationRow(
        messages=[
            Message(role="system", content="Answer in one word."),
            Message(role="user", content="What is the capital of France?"),
        ],
        ground_truth="Paris",
        input_metadata=InputMetadata(row_id="capital-france"),
    ),
    EvaluationRow(
        messages=[
            Message(role="user", content="What is the weather in Paris?"),
            Message(
                role="assistant",
                content=None,
                tool_calls=[
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "weather", "arguments": '{"city": "Paris"}'},
                    }
                ],
            ),
            Message(role="tool", content="sunny", tool_call_id="call_1", name="weather"),
        ],
        tools=[WEATHER_TOOL],
        ground_truth="sunny",
    ),
    EvaluationRow(messages=[Message(role="user", content="Pick a number from 1 to 9.")], ground_truth="3"),
    EvaluationRow(messages=[Message(role="user", content="Pick a number from 1 to 9.")], ground_truth="7"),
]


@evaluation_test(
    input_rows=[ROWS],
    completion_params=[{"model": "tiny-qa", "temperature": 0.0}],
    rollout_processor=SingleTurnRolloutProcessor(),
    mode="pointwise",
)
def test_qa_rows(row: EvaluationRow) -> EvaluationRow:
    """1.0 when the assistant's reply is exactly the ground truth."""
    last = row.messages[-1]
    reply = str(last.content or "").strip() if last.role == "assistant" else ""
    exact = reply == str(row.ground_truth)
    row.evaluation_result = EvaluateResult(score=float(exact), reason=f"reply {reply!r}", is_score_valid=True)
    return row
