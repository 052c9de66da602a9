"""A rollout's calls placed against what it holds (first, extend, fork), the budget's terminal reply, and the wire
forms compared and rendered; with the tiny model's tokenizer under TRL's Qwen 2.5 template and a scripted
generator (a fake, named as such: it returns fixed ids so each placement rule can be pinned)."""

import asyncio
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pytest
from transformers import AutoTokenizer

from ep_trl import ConfigError
from ep_trl.capture.parsing import ToolCallParser
from ep_trl.capture.placement import RolloutCapture, TurnRequest
from ep_trl.capture.wire import canonical, reply_message, template_form
from ep_trl.generation import Generation, SamplingParams
from ep_trl.trajectory.template import ChatTemplate
from ep_trl.trajectory.tokens import TurnLimits

if TYPE_CHECKING:
    from collections.abc import Sequence

    from transformers import PreTrainedTokenizerBase

    from ep_trl.generation import Generator, PromptImages


TOOLS = (
    {
        "type": "function",
        "function": {
            "name": "add",
            "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
        },
    },
)
CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'


class ScriptedGenerator:
    """Fake backend: returns the next scripted text's ids (ending with <|im_end|>), logprob -1 each."""

    name = "scripted"
    max_model_len = None
    failure = None

    def __init__(self, tokenizer: "PreTrainedTokenizerBase", texts: "Sequence[str]") -> None:
        end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        assert isinstance(end, int)
        self._ids = [tokenizer.encode(t, add_special_tokens=False) + [end] for t in texts]
        self.prompts: list[list[int]] = []

    async def begin_call(self) -> None:
        pass

    async def end_call(self) -> None:
        pass

    async def generate(
        self, prompt_ids: "Sequence[int]", params: SamplingParams, images: "PromptImages | None" = None
    ) -> Generation:
        self.prompts.append(list(prompt_ids))
        ids = self._ids.pop(0)[: params.max_tokens]
        return Generation(tuple(ids), (-1.0,) * len(ids), "stop")

    async def aclose(self) -> None:
        pass


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> "PreTrainedTokenizerBase":
    from trl.chat_template_utils import qwen2_5_chat_template

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.chat_template = qwen2_5_chat_template
    return tok


def capture(
    tokenizer: "PreTrainedTokenizerBase", texts: "Sequence[str]", budget: int = 2000
) -> "tuple[RolloutCapture, ScriptedGenerator]":
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert isinstance(end, int)
    limits = TurnLimits(SamplingParams(max_tokens=200), budget, (end,))
    generator = ScriptedGenerator(tokenizer, texts)
    return (
        RolloutCapture(
            "t", "test", limits, ChatTemplate(tokenizer), cast("Generator", generator), ToolCallParser(tokenizer)
        ),
        generator,
    )


def wire(reply: object) -> Any:
    """The assistant message as an agent sends it back: arguments a JSON string, content None, an id added."""
    return json.loads(json.dumps(reply))


USER = [{"role": "user", "content": "What is 1 + 2?"}]


def test_a_tool_loop_extends_one_segment_with_the_tool_result_masked(tokenizer: "PreTrainedTokenizerBase") -> None:
    rollout, generator = capture(tokenizer, [CALL, "3"])
    first = asyncio.run(rollout.turn(TurnRequest(tuple(USER), TOOLS)))
    assert first.finish_reason == "tool_calls"
    [call] = first.message["tool_calls"]
    assert call["function"] == {"name": "add", "arguments": json.dumps({"a": 1, "b": 2})}
    history = USER + [wire(first.message), {"role": "tool", "content": "3", "tool_call_id": call["id"]}]
    second = asyncio.run(rollout.turn(TurnRequest(tuple(history), TOOLS)))
    assert second.message == {"role": "assistant", "content": "3"}
    trajectory = rollout.trajectory(USER)
    assert rollout.forks == 0 and trajectory.realigned == 0
    # the second call was generated from exactly the held ids: prompt, sampled call, masked bridge
    assert generator.prompts[1] == list(trajectory.prompt_ids) + list(
        trajectory.completion_ids[: len(generator.prompts[1]) - len(trajectory.prompt_ids)]
    )
    texts = [tokenizer.decode(list(s), skip_special_tokens=True) for s in trajectory.sampled_segments()]
    assert texts == [CALL, "3"]
    inserted = [t for t, m in zip(trajectory.completion_ids, trajectory.env_mask) if not m]
    assert "<tool_response>\n3\n</tool_response>" in tokenizer.decode(inserted)


def test_rewritten_history_forks_counted_and_the_last_segment_is_kept(tokenizer: "PreTrainedTokenizerBase") -> None:
    rollout, _ = capture(tokenizer, ["first draft", "second answer"])
    first = asyncio.run(rollout.turn(TurnRequest(tuple(USER))))
    rewritten = USER + [
        {"role": "assistant", "content": "an answer the model never gave"},
        {"role": "user", "content": "again"},
    ]
    asyncio.run(rollout.turn(TurnRequest(tuple(rewritten))))
    assert rollout.forks == 1 and first.message["content"] == "first draft"
    trajectory = rollout.trajectory(USER)
    assert [tokenizer.decode(list(s), skip_special_tokens=True) for s in trajectory.sampled_segments()] == [
        "second answer"
    ]
    assert "an answer the model never gave" in tokenizer.decode(list(trajectory.prompt_ids))  # context, not trained on


def test_changed_tools_or_a_repeated_request_fork(tokenizer: "PreTrainedTokenizerBase") -> None:
    rollout, _ = capture(tokenizer, ["a", "b", "c"])
    asyncio.run(rollout.turn(TurnRequest(tuple(USER), TOOLS)))
    asyncio.run(rollout.turn(TurnRequest(tuple(USER), TOOLS)))  # a retry of the same call
    held = USER + [{"role": "assistant", "content": "b"}, {"role": "user", "content": "more"}]
    asyncio.run(rollout.turn(TurnRequest(tuple(held))))  # continues, but without the tools
    assert rollout.forks == 2


def test_a_spent_budget_answers_an_empty_unrecorded_reply(tokenizer: "PreTrainedTokenizerBase") -> None:
    rollout, generator = capture(tokenizer, [CALL], budget=40)
    first = asyncio.run(rollout.turn(TurnRequest(tuple(USER), TOOLS)))
    history = USER + [wire(first.message), {"role": "tool", "content": "3" * 200, "tool_call_id": "x"}]
    reply = asyncio.run(rollout.turn(TurnRequest(tuple(history), TOOLS)))
    assert reply.message == {"role": "assistant", "content": ""} and reply.finish_reason == "length"
    assert rollout.stop_reason == "token_budget" and rollout.budget_blocked_tokens > 0
    assert len(generator.prompts) == 1  # nothing generated for it, nothing recorded
    assert len(rollout.trajectory(USER).sampled_segments()) == 1


def test_wire_variants_of_one_message_compare_equal_and_render_once_encoded() -> None:
    sent = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call-1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}
        ],
    }
    echoed = {
        "role": "assistant",
        "content": "",
        "function_call": None,
        "tool_calls": [
            {"id": "other-id", "type": "function", "function": {"name": "add", "arguments": '{"b":2,"a":1}'}}
        ],
    }
    assert canonical(sent) == canonical(echoed)
    assert canonical(sent) != canonical({**echoed, "content": "text"})
    [rendered] = template_form([echoed])
    assert rendered["tool_calls"][0]["function"]["arguments"] == {"a": 1, "b": 2}  # an object, not a JSON string
    assert "function_call" not in rendered


def test_a_call_to_a_tool_that_was_not_offered_is_text() -> None:
    parsed = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": "rm_rf", "arguments": {}}}],
    }
    assert reply_message(parsed, "raw text", {"add"}, "c") == {"role": "assistant", "content": "raw text"}


def test_sampled_ids_that_re_tokenize_differently_are_kept_and_the_bridge_realigned(
    tokenizer: "PreTrainedTokenizerBase",
) -> None:
    """The model may sample a non-canonical split of its text; the held ids stay what it sampled and the bridge
    follows the template's rule for the text after the assistant turn (counted)."""
    rollout, generator = capture(tokenizer, ["", "fine"])
    letters = [tokenizer.convert_tokens_to_ids(c) for c in "word"]  # one id per letter, not the word's own token
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    generator._ids[0] = letters + [end]
    assert tokenizer.encode("word", add_special_tokens=False) != letters
    first = asyncio.run(rollout.turn(TurnRequest(tuple(USER))))
    assert first.message == {"role": "assistant", "content": "word"}
    asyncio.run(rollout.turn(TurnRequest(tuple(USER + [first.message, {"role": "user", "content": "and?"}]))))
    trajectory = rollout.trajectory(USER)
    assert rollout.forks == 0 and trajectory.realigned == 1
    assert list(trajectory.completion_ids[: len(letters) + 1]) == letters + [end]  # kept as sampled
    inserted = [t for t, m in zip(trajectory.completion_ids, trajectory.env_mask) if not m]
    assert tokenizer.decode(inserted) == "\n<|im_start|>user\nand?<|im_end|>\n<|im_start|>assistant\n"


class ConfigErrorGenerator(ScriptedGenerator):
    """Fault injection: the backend raises ep_trl's ConfigError (a turn past max_episode_images does)."""

    async def generate(
        self, prompt_ids: "Sequence[int]", params: SamplingParams, images: "PromptImages | None" = None
    ) -> Generation:
        raise ConfigError("An episode's turn would hold 3 images, more than max_episode_images=2")


def test_a_configuration_error_of_a_turn_ends_the_call_not_only_the_episode(
    tokenizer: "PreTrainedTokenizerBase",
) -> None:
    """A ConfigError fails every episode alike: it is kept as fatal (raised by the driver), not as this episode's
    generation failure."""
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert isinstance(end, int)
    limits = TurnLimits(SamplingParams(max_tokens=20), 2000, (end,))
    rollout = RolloutCapture(
        "t",
        "test",
        limits,
        ChatTemplate(tokenizer),
        cast("Generator", ConfigErrorGenerator(tokenizer, [])),
        ToolCallParser(tokenizer),
    )
    with pytest.raises(ConfigError, match="max_episode_images=2"):
        asyncio.run(rollout.turn(TurnRequest(tuple(USER))))
    assert isinstance(rollout.fatal, ConfigError) and rollout.failure is None
