"""The bridge rule between turns: clean when the template extends the held tokens, realigned (and counted) when not."""

import random
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pytest
from transformers import AutoTokenizer

from ep_trl.generation import Generation
from ep_trl.trajectory.template import ChatTemplate
from ep_trl.trajectory.tokens import Encoded, Trajectory, TrajectoryBuilder

if TYPE_CHECKING:
    from collections.abc import Sequence

    from transformers import PreTrainedTokenizerBase


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> "PreTrainedTokenizerBase":
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def sampled(ids: "Sequence[int]") -> Generation:
    return Generation(tuple(ids), tuple(-1.0 for _ in ids), "stop")


def bridge_ids(
    template: ChatTemplate, messages: list[dict[str, Any]], held: "Sequence[int]", turn: "Sequence[int]", end: int
) -> tuple[list[int], bool]:
    """The bridge after ``held`` ids (text only: no images), as ids, and whether it was realigned."""
    segment, realigned = template.bridge(messages, Encoded(tuple(held)), sampled(turn), [end])
    assert segment.images == () and segment.unexpanded_ids == segment.ids
    return list(segment.ids), realigned


def conversation(answer: str) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "first observation"},
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "second observation"},
    ]


def test_clean_bridge_is_the_rest_of_the_rendering(tokenizer: "PreTrainedTokenizerBase") -> None:
    template = ChatTemplate(tokenizer)
    prompt = template.prompt_ids(conversation("")[:1])
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert isinstance(end, int)
    turn = template.encode("hello there") + [end]
    bridge, realigned = bridge_ids(template, conversation("hello there"), prompt + turn, turn, end)
    assert not realigned
    assert tokenizer.decode(bridge) == "\n<|im_start|>user\nsecond observation<|im_end|>\n<|im_start|>assistant\n"
    assert prompt + turn + bridge == template.prompt_ids(conversation("hello there"))


def test_non_canonical_tokens_are_kept_and_the_bridge_realigned(tokenizer: "PreTrainedTokenizerBase") -> None:
    template = ChatTemplate(tokenizer)
    prompt = template.prompt_ids(conversation("")[:1])
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert isinstance(end, int)
    # "hello" sampled one character at a time: decodes to the same text, re-encodes to other ids
    turn = [i for ch in "hello" for i in template.encode(ch)] + [end]
    assert turn[:-1] != template.encode("hello")
    bridge, realigned = bridge_ids(template, conversation("hello"), prompt + turn, turn, end)
    assert realigned
    # the sampled end-of-turn token is not repeated; the model would see the same text as the template renders
    assert tokenizer.decode(prompt + turn + bridge) == template.render(conversation("hello"))


def test_turn_cut_at_max_tokens_gets_the_end_of_turn_marker_in_the_bridge(tokenizer: "PreTrainedTokenizerBase") -> None:
    template = ChatTemplate(tokenizer)
    prompt = template.prompt_ids(conversation("")[:1])
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert isinstance(end, int)
    turn = [i for ch in "abc" for i in template.encode(ch)]  # no EOS sampled, and non-canonical
    bridge, realigned = bridge_ids(template, conversation("abc"), prompt + turn, turn, end)
    assert realigned and bridge[0] == end


def test_template_that_rewrites_history_is_realigned(tokenizer: "PreTrainedTokenizerBase") -> None:
    # a template that trims assistant content breaks the prefix property for content with outer spaces
    trimming = tokenizer.chat_template.replace("message['content']", "message['content'] | trim")
    assert trimming != tokenizer.chat_template
    tokenizer = AutoTokenizer.from_pretrained(tokenizer.name_or_path)
    tokenizer.chat_template = trimming
    template = ChatTemplate(tokenizer)
    prompt = template.prompt_ids(conversation("")[:1])
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert isinstance(end, int)
    turn = template.encode("  spaced  ") + [end]
    bridge, realigned = bridge_ids(template, conversation("  spaced  "), prompt + turn, turn, end)
    assert realigned
    text = tokenizer.decode(bridge)
    assert isinstance(text, str) and text.startswith("\n<|im_start|>user\nsecond observation")


def test_builder_masks_and_logprobs_align() -> None:
    builder = TrajectoryBuilder((1, 2, 3))
    builder.add_sampled(Generation((4, 5), (-0.5, -0.25), "stop"))
    builder.add_inserted([6, 7, 8])
    builder.add_sampled(Generation((9,), (-1.0,), "length"))
    traj = builder.build()
    assert traj.completion_ids == (4, 5, 6, 7, 8, 9)
    assert traj.env_mask == (1, 1, 0, 0, 0, 1)
    assert traj.logprobs == (-0.5, -0.25, 0.0, 0.0, 0.0, -1.0)
    assert traj.sampled_segments() == [(4, 5), (9,)]
    assert builder.held_ids() == [1, 2, 3, 4, 5, 6, 7, 8, 9]


def test_generation_rejects_misaligned_logprobs() -> None:
    with pytest.raises(ValueError, match="must align"):
        Generation((1, 2), (-1.0,), "stop")


def reference_turn_numbers(env_mask: "Sequence[int]") -> tuple[int, ...]:
    numbers: list[int] = []
    turn, previous = 0, 0
    for m in env_mask:
        if m and not previous:
            turn += 1
        numbers.append(turn if m else 0)
        previous = m
    return tuple(numbers)


@pytest.mark.parametrize("seed", range(20))
def test_sampled_runs_give_the_turns_a_token_by_token_count_gives(seed: int) -> None:
    rng = random.Random(seed)
    mask = tuple(rng.choice([0, 1, 1]) for _ in range(rng.randrange(0, 60)))
    ids = tuple(range(100, 100 + len(mask)))
    traj = Trajectory((1, 2), ids, tuple(0.0 for _ in mask), mask)
    turns = reference_turn_numbers(mask)
    assert traj.turn_numbers() == turns
    assert traj.sampled_segments() == [
        tuple(t for t, n in zip(ids, turns) if n == k) for k in range(1, max(turns, default=0) + 1)
    ]


def test_the_held_ids_carry_their_json_as_the_episode_grows() -> None:
    """``TrajectoryBuilder.held_ids()`` keeps its JSON text turn by turn (the vLLM client sends it as is): at every
    turn it is the JSON of the ids it holds, converted with ``int`` as a request body takes them, also after a list
    was changed other than through ``add_*``."""
    import json

    import numpy as np

    rng = random.Random(7)
    for case in range(30):
        builder = TrajectoryBuilder(tuple(rng.randrange(200_000) for _ in range(rng.randrange(0, 40))))
        for turn in range(rng.randrange(1, 12)):
            held = builder.held_ids()
            assert held == list(builder.prompt_ids) + builder.completion_ids and isinstance(held, list)
            assert held.json == json.dumps([int(t) for t in held], separators=(",", ":"))
            ids = [rng.randrange(200_000) for _ in range(rng.randrange(0, 9))]
            if turn % 2:
                builder.add_sampled(sampled(ids))
            else:  # numpy ids too: the text holds them as ints
                builder.add_inserted(
                    Encoded(cast("tuple[int, ...]", tuple(np.int64(t) for t in ids))) if case % 3 == 0 else ids
                )
            if case % 5 == 0 and turn == 2:
                builder.completion_ids.append(5)  # out of band: the next held_ids() encodes the whole again
                builder.logprobs.append(0.0)
                builder.env_mask.append(0)
        held = builder.held_ids()
        assert json.loads(held.json) == list(builder.prompt_ids) + builder.completion_ids
