"""The offline tiny model: loads with Auto* classes, generates, round-trips text, is deterministic."""

import json
from pathlib import Path
from typing import TYPE_CHECKING, cast

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer, BatchEncoding, GenerationConfig

from ep_trl.devtools.tiny_model import CHAT_TEMPLATE, build_tiny_model

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


ASCII_SAMPLES = [
    "Hello, world!",
    "  leading and trailing spaces  ",
    "def f(x):\n\treturn x * 2  # comment\n",
    "Task vowels, step 1 of 3: write a short word using mostly the letters aeiou.",
    "You wrote 'x\"y' (score 0.33). 0123456789 ~!@#$%^&*()_+-=[]{}|;:,.<>/?`",
    "aeiou\n\n\nzzz   \r\n",
    "".join(chr(c) for c in range(32, 127)),
]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> "PreTrainedTokenizerBase":
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def test_config_is_the_specified_qwen2(tiny_model_dir: Path) -> None:
    cfg = json.loads((tiny_model_dir / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen2ForCausalLM"]
    assert cfg["model_type"] == "qwen2"
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"]) == (128, 2, 2)
    assert cfg["hidden_size"] // cfg["num_attention_heads"] == 64  # head_dim
    assert cfg["num_key_value_heads"] == 1
    assert cfg["intermediate_size"] == 256
    assert cfg["max_position_embeddings"] == 2048
    assert cfg["tie_word_embeddings"] is True
    assert cfg["dtype"] == "float32" and cfg["torch_dtype"] == "float32"
    assert 900 <= cfg["vocab_size"] <= 1100


def test_tokenizer_special_tokens(tokenizer: "PreTrainedTokenizerBase", tiny_model_dir: Path) -> None:
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == im_end
    assert tokenizer.pad_token == "<|endoftext|>"
    assert tokenizer.pad_token_id == tokenizer.convert_tokens_to_ids("<|endoftext|>")
    for special in ("<|endoftext|>", "<|im_start|>", "<|im_end|>"):
        ids = tokenizer.encode(special, add_special_tokens=False)
        assert len(ids) == 1, f"{special} must be a single token, got {ids}"
    assert len(tokenizer) == json.loads((tiny_model_dir / "config.json").read_text())["vocab_size"]
    gen = GenerationConfig.from_pretrained(tiny_model_dir)
    assert gen.eos_token_id == im_end


@pytest.mark.parametrize("text", ASCII_SAMPLES)
def test_ascii_text_round_trips(tokenizer: "PreTrainedTokenizerBase", text: str) -> None:
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text
    # No BOS or other tokens are added implicitly.
    assert tokenizer(text)["input_ids"] == ids


def test_tokenizer_json_matches_auto_tokenizer(tokenizer: "PreTrainedTokenizerBase", tiny_model_dir: Path) -> None:
    """vLLM and raw `tokenizers` users must get the same ids as transformers' AutoTokenizer."""
    from tokenizers import Tokenizer

    raw = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    for text in ASCII_SAMPLES + ["<|im_start|>user\nhi 42<|im_end|>\n"]:
        assert raw.encode(text).ids == tokenizer.encode(text, add_special_tokens=False)


def test_chat_template_renders_chatml(tokenizer: "PreTrainedTokenizerBase") -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Play the letters game."},
        {"role": "assistant", "content": "aeiou"},
        {"role": "user", "content": "Again"},
    ]
    expected = (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nPlay the letters game.<|im_end|>\n"
        "<|im_start|>assistant\naeiou<|im_end|>\n"
        "<|im_start|>user\nAgain<|im_end|>\n"
    )
    assert tokenizer.chat_template == CHAT_TEMPLATE
    assert tokenizer.apply_chat_template(messages, tokenize=False) == expected
    assert (
        tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        == expected + "<|im_start|>assistant\n"
    )
    # token ids, not a dict: a list[int]
    ids = cast("list[int]", tokenizer.apply_chat_template(messages[:2], add_generation_prompt=True, return_dict=False))
    assert tokenizer.decode(ids) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nPlay the letters game.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_model_loads_and_generates(tiny_model_dir: Path, tokenizer: "PreTrainedTokenizerBase") -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert model.dtype == torch.float32
    embeddings, head = model.get_input_embeddings(), model.get_output_embeddings()
    assert isinstance(embeddings, torch.nn.Embedding) and isinstance(head, torch.nn.Linear)
    assert embeddings.weight.data_ptr() == head.weight.data_ptr()
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Play the letters game."}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    assert isinstance(prompt, BatchEncoding)
    out = model.generate(**prompt, max_new_tokens=8, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    new_tokens = out[0, prompt["input_ids"].shape[1] :]
    assert 1 <= new_tokens.numel() <= 8
    assert all(0 <= t < len(tokenizer) for t in new_tokens.tolist())
    with torch.no_grad():
        logits = model(**prompt).logits
    assert logits.shape[-1] == len(tokenizer)
    assert torch.isfinite(logits).all()


def test_same_seed_is_identical_and_other_seed_differs(tiny_model_dir: Path, tmp_path: Path) -> None:
    again = build_tiny_model(tmp_path / "again", seed=0)
    other = build_tiny_model(tmp_path / "other", seed=1)
    base_w = load_file(str(tiny_model_dir / "model.safetensors"))
    again_w = load_file(str(again / "model.safetensors"))
    other_w = load_file(str(other / "model.safetensors"))
    assert base_w.keys() == again_w.keys()
    assert all(torch.equal(base_w[k], again_w[k]) for k in base_w)
    assert any(not torch.equal(base_w[k], other_w[k]) for k in base_w if base_w[k].dim() == 2)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "config.json"):
        assert (tiny_model_dir / name).read_bytes() == (again / name).read_bytes(), name
    # The tokenizer does not depend on the weight seed.
    assert (tiny_model_dir / "tokenizer.json").read_bytes() == (other / "tokenizer.json").read_bytes()


def test_build_reuses_a_finished_directory_and_rebuilds_on_seed_change(tmp_path: Path) -> None:
    out = build_tiny_model(tmp_path / "m", seed=3)
    weights = out / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    assert build_tiny_model(out, seed=3) == out
    assert weights.stat().st_mtime_ns == stamp  # reused, not rewritten
    build_tiny_model(out, seed=4)
    assert json.loads((out / "ep_trl_tiny_model.json").read_text())["seed"] == 4
    seed4 = load_file(str(weights))
    fresh = load_file(str(build_tiny_model(tmp_path / "fresh4", seed=4) / "model.safetensors"))
    assert all(torch.equal(seed4[k], fresh[k]) for k in seed4)


def test_build_leaves_global_torch_rng_alone(tmp_path: Path) -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_tiny_model(tmp_path / "rng", seed=7)
    assert torch.equal(torch.rand(3), expected)
