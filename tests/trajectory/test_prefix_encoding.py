"""Incremental encoding of a growing conversation (``PrefixEncoder``): the ids are the ids of encoding it whole."""

import random
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import trl
from tokenizers import AddedToken
from transformers import AutoTokenizer

from ep_trl.devtools.tiny_model import build_hf_tokenizer
from ep_trl.generation import Generation
from ep_trl.trajectory.template import ChatTemplate
from ep_trl.trajectory.tokens import PrefixEncoder, TrajectoryBuilder, cut_tokens

if TYPE_CHECKING:
    from collections.abc import Iterator

    from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast


TEMPLATES = Path(trl.__file__).parent / "chat_templates"
LLAMA3_TOKENS = ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")
#: Message texts that sit on a cut: special token strings, halves of them, whitespace next to them.
TRICKY = [
    "plain",
    " lead",
    "trail ",
    "<|im_start|>",
    "x<|im_end|>y",
    "<|im_",
    "|im_end|>",
    "\n\n",
    " <|im_end|> ",
    "<|eot_id|>",
    "<|start_header_id|>user<|end_header_id|>",
    "é ü 中文",
    "<",
    "<<|im_start|>",
    "",
]


@pytest.fixture(scope="module")
def chatml(tiny_model_dir: Path) -> "PreTrainedTokenizerBase":
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def llama3() -> "PreTrainedTokenizerFast":
    tokenizer = build_hf_tokenizer(LLAMA3_TOKENS)
    tokenizer.bos_token = "<|begin_of_text|>"
    tokenizer.chat_template = (TEMPLATES / "llama3.jinja").read_text()
    return tokenizer


def grow(rng: random.Random) -> "Iterator[list[dict[str, str]]]":
    """A conversation growing by one assistant and one user message per turn, made of the tricky texts."""
    messages = [{"role": "system", "content": rng.choice(TRICKY)}, {"role": "user", "content": rng.choice(TRICKY)}]
    for _ in range(12):
        messages += [
            {"role": "assistant", "content": "".join(rng.choices(TRICKY, k=3))},
            {"role": "user", "content": "".join(rng.choices(TRICKY, k=2))},
        ]
        yield list(messages)


@pytest.mark.parametrize("which", ["chatml", "llama3"])
def test_incremental_encoding_equals_the_whole_encoding(which: str, request: pytest.FixtureRequest) -> None:
    tokenizer = request.getfixturevalue(which)
    template = ChatTemplate(tokenizer)
    assert template._prefixes._cuts, "the template writes special tokens to cut before"
    for seed in range(5):
        for messages in grow(random.Random(seed)):
            text = template.render(messages)
            assert template.encode(text) == tokenizer.encode(text, add_special_tokens=False)
    assert len(template._prefixes._kept) > 0


def test_a_turn_encodes_only_what_it_adds(chatml: "PreTrainedTokenizerBase") -> None:
    """The second text starts with the first's kept part: only the rest goes to the tokenizer."""
    seen: list[str] = []

    def encode(text: str) -> list[int]:
        seen.append(text)
        return chatml.encode(text, add_special_tokens=False)

    encoder = PrefixEncoder(encode, cut_tokens(chatml))
    first = "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
    second = first + "hi there<|im_end|>\n<|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\n"
    assert encoder(first) == chatml.encode(first, add_special_tokens=False)
    seen.clear()
    assert encoder(second) == chatml.encode(second, add_special_tokens=False)
    prompt = "<|im_start|>assistant\n"  # after the last cut, the same both times: encoded once, with the first text
    assert seen == [second[len(first) - len(prompt) : len(second) - len(prompt)]]


def test_what_follows_the_last_cut_is_encoded_once_and_long_or_many_tails_stay_exact(
    chatml: "PreTrainedTokenizerBase",
) -> None:
    """The tail after the last cut (the generation prompt) is kept with its ids: each distinct short tail goes to the
    tokenizer once; a long one every time; with more tails than are kept, the oldest is encoded again; the ids are
    always the whole encode's."""
    seen: list[str] = []

    def encode(text: str) -> list[int]:
        seen.append(text)
        return chatml.encode(text, add_special_tokens=False)

    encoder = PrefixEncoder(encode, cut_tokens(chatml))
    whole = lambda text: chatml.encode(text, add_special_tokens=False)  # noqa: E731
    texts = [f"<|im_start|>user\nturn {i}<|im_end|>\n<|im_start|>assistant\n" for i in range(5)]
    assert [encoder(t) for t in texts] == [whole(t) for t in texts]
    assert seen.count("<|im_start|>assistant\n") == 1
    long_tail = "<|im_start|>assistant\n" + "x y " * 100
    assert encoder(texts[0] + long_tail) == whole(texts[0] + long_tail)
    assert encoder(texts[1] + long_tail) == whole(texts[1] + long_tail)
    assert seen.count(long_tail) == 2
    tails = [f"<|im_start|>assistant {i}\n" for i in range(70)]  # more than are kept
    assert [encoder(texts[0] + t) for t in tails + tails[:3]] == [whole(texts[0] + t) for t in tails + tails[:3]]
    assert seen.count(tails[0]) == 2 and seen.count(tails[-1]) == 1


def test_tokens_that_strip_whitespace_or_hide_inside_others_are_no_cuts() -> None:
    tokenizer = build_hf_tokenizer()
    tokenizer.add_special_tokens(
        {
            "additional_special_tokens": [
                AddedToken("<lstrip>", lstrip=True, special=True),
                AddedToken("<rstrip>", rstrip=True, special=True),
                AddedToken("[inner]", special=True),
                AddedToken("x[in", special=True),
            ]
        }
    )
    cuts = cut_tokens(tokenizer)
    assert "<|im_start|>" in cuts and "<|im_end|>" in cuts
    assert not {"<lstrip>", "<rstrip>", "[inner]"} & set(cuts)


def test_bridges_of_a_long_episode_are_those_of_a_fresh_template(chatml: "PreTrainedTokenizerBase") -> None:
    """Ten turns through one template (prefixes kept) give the bridges a template with nothing kept gives."""
    kept = ChatTemplate(chatml)
    end = chatml.convert_tokens_to_ids("<|im_end|>")
    assert isinstance(end, int)
    messages = [{"role": "user", "content": "observation 0"}]
    builder = TrajectoryBuilder.start(kept.prompt(messages))
    for turn in range(1, 11):
        text = f"answer {turn} <|im_start|>" if turn % 3 == 0 else f"answer {turn}"
        last = Generation(tuple(kept.encode(text) + [end]), tuple([-1.0] * (len(kept.encode(text)) + 1)), "stop")
        builder.add_sampled(last)
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": f"observation {turn}"}]
        bridge, realigned = kept.bridge(messages, builder.held(), last, [end])
        fresh, fresh_realigned = ChatTemplate(chatml).bridge(messages, builder.held(), last, [end])
        assert (bridge, realigned) == (fresh, fresh_realigned)
        builder.add_inserted(bridge)
