"""A tiny Qwen2-style causal LM and byte-level BPE tokenizer, built offline.

Tests, benchmarks and the README's CPU demo need a real model directory that
transformers, TRL and vLLM (CPU build) can all load, but this project cannot
download weights. ``build_tiny_model`` creates one from scratch in a couple of
seconds: random weights (seeded) and a tokenizer trained on a small built-in
corpus, saved in the standard Hugging Face layout.
"""

import json
import logging
import random
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX as QWEN2_PRETOKENIZE_REGEX

logger = logging.getLogger(__name__)

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS: tuple[str, ...] = (ENDOFTEXT, IM_START, IM_END)

#: Target vocabulary size (special tokens included) of the trained tokenizer.
VOCAB_SIZE = 1000

#: ChatML: each message is ``<|im_start|>{role}\n{content}<|im_end|>\n``; a
#: generation prompt appends ``<|im_start|>assistant\n``. No system message is
#: injected, so what the caller sends is exactly what is rendered.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

#: Written next to the model so a reused directory can be checked against the
#: seed it was built with (a directory built with another seed is rebuilt).
BUILD_INFO_FILE = "ep_trl_tiny_model.json"
_REQUIRED_FILES: tuple[str, ...] = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    BUILD_INFO_FILE,
)

_WORDS = (
    "the a an and or but if then else when while for with without to from of in on at by "
    "model token reward policy action observation environment episode step task game play "
    "write short word letters vowels digits score prompt answer question user assistant system "
    "train learn sample generate evaluate rollout group mean best value loss gradient batch "
    "red green blue small large quick slow happy idea river stone light house music paper "
    "apple orange banana table window garden winter summer city road friend story number"
).split()

_CODE_LINES = (
    "def add(a, b):\n    return a + b\n",
    "for i in range(10):\n    print(i)\n",
    "import json\ndata = json.loads(text)\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
    "if x > 0 and y < 5:\n    result = [x, y]\nelse:\n    result = {}\n",
    'name = "world"\nmessage = f"hello {name}!"\n',
    "while not done:\n    obs, reward, done = env.step(action)\n",
    "x = (1 + 2) * 3 - 4 / 5 % 6\n",
)


def _training_corpus() -> list[str]:
    """Return a deterministic English/code-ish corpus (about 100 KB of text).

    Generated rather than shipped so the repository holds no data files; the
    fixed ``random.Random(1234)`` keeps the tokenizer identical across builds.
    It includes the letters game's own phrasing and plain ASCII punctuation so
    that common test strings tokenize compactly.
    """
    rng = random.Random(1234)
    onsets = ["b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "st", "tr", "ch", "sh"]
    nuclei = ["a", "e", "i", "o", "u", "ai", "ou", "ea"]
    codas = ["", "", "n", "r", "s", "t", "l", "ng", "ck"]
    pseudo_words = [
        "".join(rng.choice(onsets) + rng.choice(nuclei) + rng.choice(codas) for _ in range(rng.randint(1, 3)))
        for _ in range(400)
    ]
    vocabulary = list(_WORDS) * 4 + pseudo_words
    lines: list[str] = []
    for _ in range(1500):
        n = rng.randint(4, 14)
        words = [rng.choice(vocabulary) for _ in range(n)]
        sentence = " ".join(words)
        sentence = sentence[0].upper() + sentence[1:] + rng.choice([".", "!", "?", ",", ";", ":"])
        lines.append(sentence)
    for _ in range(60):
        lines.append(rng.choice(_CODE_LINES))
    for task, alphabet in (("vowels", "aeiou"), ("digits", "0123456789"), ("abc", "abc")):
        for step in range(1, 6):
            lines.append(f"Task {task}, step {step} of 5: write a short word using mostly the letters {alphabet}.")
            lines.append(f"You wrote '{rng.choice(_WORDS)}' (score 0.{rng.randint(0, 99):02d}).")
    for _ in range(100):
        lines.append(" ".join(str(rng.randint(0, 9999)) for _ in range(6)))
        lines.append("".join(rng.choice("aeiou") for _ in range(rng.randint(2, 8))))
    lines.append("".join(chr(c) for c in range(32, 127)))
    return lines


def _train_tokenizer() -> Tokenizer:
    """Train a byte-level BPE tokenizer with the ChatML special tokens.

    The normalizer and pre-tokenizer are exactly Qwen2's (NFC, Qwen2's split
    regex, byte-level without its own regex). transformers 5 does not load a
    ``qwen2`` model's tokenizer.json verbatim: ``AutoTokenizer`` rebuilds a
    ``Qwen2Tokenizer`` from its vocab and merges with Qwen2's pipeline. Training
    with that same pipeline makes tokenizer.json, transformers 4.x, 5.x and
    vLLM all produce the same ids. Byte-level decoding means ASCII text
    round-trips exactly.
    """
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_training_corpus(), trainer=trainer)
    return tok


def build_hf_tokenizer(extra_special_tokens: tuple[str, ...] = ()) -> PreTrainedTokenizerFast:
    """Wrap the trained tokenizer with ChatML template and eos/pad settings; ``extra_special_tokens`` (e.g. a
    vision model's image placeholders) are added after the vocabulary."""
    fast = PreTrainedTokenizerFast(
        tokenizer_object=_train_tokenizer(),
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        clean_up_tokenization_spaces=False,
        model_max_length=2048,
    )
    fast.add_special_tokens({"additional_special_tokens": [IM_START, *extra_special_tokens]})
    fast.chat_template = CHAT_TEMPLATE
    return fast


def token_id(tokenizer: PreTrainedTokenizerFast, token: str) -> int:
    """The id of one token of the vocabulary (``convert_tokens_to_ids`` of one token)."""
    found = tokenizer.convert_tokens_to_ids(token)
    if not isinstance(found, int):
        raise TypeError(f"{token!r} is one token of the tiny vocabulary, yet its ids came back as {found!r}")
    return found


def _is_complete(
    out_dir: Path, seed: int, required: tuple[str, ...] = _REQUIRED_FILES, info_file: str = BUILD_INFO_FILE
) -> bool:
    """True when ``out_dir`` holds a finished build made with ``seed`` (all of ``required``, ``info_file`` naming
    the seed)."""
    if not all((out_dir / name).is_file() for name in required):
        return False
    try:
        info = json.loads((out_dir / info_file).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        logger.warning("Unreadable %s in %s (%s); rebuilding", info_file, out_dir, exc)
        return False
    return info.get("seed") == seed


def build_tiny_model(out_dir: str | Path, *, seed: int = 0) -> Path:
    """Build (or reuse) a tiny Qwen2-style model directory and return its path.

    The model is a ``Qwen2ForCausalLM`` (hidden 128, 2 layers, 2 heads of dim
    64, 1 KV head, float32, tied embeddings) with random weights drawn under
    ``torch.manual_seed(seed)`` inside a forked RNG, so the caller's global
    torch RNG state is left untouched. A directory that already holds a build
    with the same seed is reused as is, which keeps session fixtures cheap.
    """
    out = Path(out_dir)
    if _is_complete(out, seed):
        logger.info("Reusing tiny model at %s (seed %d)", out, seed)
        return out
    out.mkdir(parents=True, exist_ok=True)

    tokenizer = build_hf_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        use_sliding_window=False,
        bos_token_id=None,
        eos_token_id=token_id(tokenizer, IM_END),
        pad_token_id=token_id(tokenizer, ENDOFTEXT),
    )
    config.dtype = torch.float32
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config).float()
    model.generation_config = GenerationConfig(
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
        bos_token_id=None,
    )

    tokenizer.save_pretrained(out)
    make_tokenizer_config_portable(out / "tokenizer_config.json")
    model.save_pretrained(out, safe_serialization=True)
    _add_legacy_dtype_field(out / "config.json")
    (out / BUILD_INFO_FILE).write_text(json.dumps({"seed": seed, "vocab_size": len(tokenizer)}) + "\n")
    logger.info("Built tiny model at %s (seed %d, vocab %d)", out, seed, len(tokenizer))
    return out


def _add_legacy_dtype_field(config_path: Path) -> None:
    """Write ``torch_dtype`` next to ``dtype`` in config.json.

    transformers 5 saves only ``dtype``; servers built against older
    transformers (e.g. a vLLM CPU build) read ``torch_dtype``. Both say float32.
    """
    data = json.loads(config_path.read_text())
    data["dtype"] = "float32"
    data["torch_dtype"] = "float32"
    config_path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def make_tokenizer_config_portable(
    config_path: Path, special_tokens: tuple[str, ...] = (IM_START,), chat_template: str = CHAT_TEMPLATE
) -> None:
    """Rewrite tokenizer_config.json so transformers 4.x and 5.x both load it.

    transformers 5 saves ``tokenizer_class: TokenizersBackend`` and a list under
    ``extra_special_tokens``; transformers 4.x (as pinned by some vLLM builds)
    knows neither. ``Qwen2Tokenizer`` (4.x resolves it to Qwen2TokenizerFast,
    which reads tokenizer.json; 5.x uses it for ``qwen2`` models anyway) and
    ``additional_special_tokens`` are understood by both, and the chat template
    is also stored inline for loaders that ignore chat_template.jinja.
    """
    data = json.loads(config_path.read_text())
    data["tokenizer_class"] = "Qwen2Tokenizer"
    data.pop("extra_special_tokens", None)
    data["additional_special_tokens"] = list(special_tokens)
    data["chat_template"] = chat_template
    config_path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
