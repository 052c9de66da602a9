"""A tiny Idefics3 (SmolVLM-style) vision-language model, its processing class and chat template, built offline.

The counterpart of ``tiny_model`` for screenshots: tests and the CPU demo need a vision-language model directory
that transformers, TRL and vLLM's CPU build all load, and this project cannot download weights.
``build_tiny_vlm`` writes one in a few seconds: an ``Idefics3ForConditionalGeneration`` with random weights (a
1-layer vision encoder on 64-pixel images, pixel-shuffled into 16 tokens per image, feeding a 2-layer Llama text
model), the tiny model's byte-level BPE tokenizer plus Idefics3's image tokens, and an ``Idefics3Processor`` that
expands each ``<image>`` placeholder into ``<fake_token_around_image><global-img>`` + 16 ``<image>`` +
``<fake_token_around_image>``.

Why Idefics3 and not Qwen2-VL: on a CPU machine whose torch is the CPU build, torchvision cannot be installed from
PyPI (its wheel is built against CUDA torch and fails to import), and without it transformers cannot build a
Qwen2-VL processing class (its video processor needs torchvision) and vLLM cannot load any Qwen-VL model (its model code
imports torchvision). Idefics3's processing class has no video part, its image processor falls back to PIL, and vLLM's
CPU build serves it. Everything ep_trl does with images is model-neutral; Qwen-VL models work the same on a machine
with torchvision (GPU machines have it).
"""

import json
import logging
from pathlib import Path

import torch
from transformers import GenerationConfig, Idefics3Config, Idefics3ForConditionalGeneration, Idefics3Processor
from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

from .tiny_model import (
    ENDOFTEXT,
    IM_END,
    IM_START,
    _is_complete,
    build_hf_tokenizer,
    make_tokenizer_config_portable,
    token_id,
)

logger = logging.getLogger(__name__)

FAKE_IMAGE = "<fake_token_around_image>"
IMAGE = "<image>"
GLOBAL_IMAGE = "<global-img>"
END_OF_UTTERANCE = "<end_of_utterance>"
IMAGE_TOKENS: tuple[str, ...] = (FAKE_IMAGE, IMAGE, GLOBAL_IMAGE, END_OF_UTTERANCE)

#: Every image is resized (aspect kept, then padded) to this square, cut in 8-pixel patches and pixel-shuffled 2x2:
#: (64 / 8) ** 2 / 2 ** 2 = 16 image tokens.
IMAGE_SIZE = 64
PATCH_SIZE = 8
SCALE_FACTOR = 2
IMAGE_SEQ_LEN = (IMAGE_SIZE // PATCH_SIZE) ** 2 // SCALE_FACTOR**2

#: ChatML as in ``tiny_model``, with ``<image>`` for each image part. No system message is injected.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}{{ '<image>' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

#: Standard deviation of the random weights. Larger than transformers' 0.02 so that the untrained model's
#: next-token distribution is far from uniform and an image visibly moves it (tests compare logprobs with and
#: without the pixels).
INIT_STD = 0.2

BUILD_INFO_FILE = "ep_trl_tiny_vlm.json"
_REQUIRED_FILES: tuple[str, ...] = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "processor_config.json",
    BUILD_INFO_FILE,
)


def build_tiny_vlm(out_dir: str | Path, *, seed: int = 0) -> Path:
    """Build (or reuse) a tiny Idefics3 model directory and return its path.

    Text model: Llama, hidden 128, 2 layers, 2 heads of dim 64, 1 KV head. Vision encoder: 1 layer, width 32,
    2 heads, 64-pixel images in 8-pixel patches; 16 tokens per image (``IMAGE_SEQ_LEN``). Float32, weights drawn
    under ``torch.manual_seed(seed)`` in a forked RNG (the caller's RNG is untouched). A directory that already
    holds a build with the same seed is reused as is. ``AutoProcessor.from_pretrained(dir)`` gives the processing class,
    ``AutoModelForImageTextToText.from_pretrained(dir)`` the model.
    """
    out = Path(out_dir)
    if _is_complete(out, seed, _REQUIRED_FILES, BUILD_INFO_FILE):
        logger.info("Reusing tiny vision-language model at %s (seed %d)", out, seed)
        return out
    out.mkdir(parents=True, exist_ok=True)

    tokenizer = build_hf_tokenizer(extra_special_tokens=IMAGE_TOKENS)
    eos, pad = token_id(tokenizer, IM_END), token_id(tokenizer, ENDOFTEXT)
    config = Idefics3Config(
        text_config={
            "model_type": "llama",
            "vocab_size": len(tokenizer),
            "hidden_size": 128,
            "intermediate_size": 256,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "max_position_embeddings": 4096,
            "initializer_range": INIT_STD,
            "bos_token_id": None,
            "eos_token_id": eos,
            "pad_token_id": pad,
            "tie_word_embeddings": False,
        },
        vision_config={
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "image_size": IMAGE_SIZE,
            "patch_size": PATCH_SIZE,
            "initializer_range": INIT_STD,
        },
        scale_factor=SCALE_FACTOR,
        image_token_id=token_id(tokenizer, IMAGE),
        tie_word_embeddings=False,
    )
    config.pad_token_id = pad  # not a declared argument of Idefics3Config's __init__; the same as passing it
    config.dtype = torch.float32
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Idefics3ForConditionalGeneration(config).float()
    model.generation_config = GenerationConfig(eos_token_id=eos, pad_token_id=pad, bos_token_id=None)

    image_processor = Idefics3ImageProcessorPil(
        do_image_splitting=False,
        size={"longest_edge": IMAGE_SIZE},
        max_image_size={"longest_edge": IMAGE_SIZE},
    )
    processing_class = Idefics3Processor(
        image_processor=image_processor, tokenizer=tokenizer, image_seq_len=IMAGE_SEQ_LEN, chat_template=CHAT_TEMPLATE
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    processing_class.save_pretrained(out)
    make_tokenizer_config_portable(
        out / "tokenizer_config.json", special_tokens=(IM_START, *IMAGE_TOKENS), chat_template=CHAT_TEMPLATE
    )
    model.save_pretrained(out, safe_serialization=True)
    _add_legacy_fields(out / "config.json", pad)
    (out / BUILD_INFO_FILE).write_text(json.dumps({"seed": seed, "vocab_size": len(tokenizer)}) + "\n")
    logger.info("Built tiny vision-language model at %s (seed %d, vocab %d)", out, seed, len(tokenizer))
    return out


def _add_legacy_fields(config_path: Path, pad_token_id: int) -> None:
    """Fields older transformers (e.g. a vLLM CPU build's) read: ``torch_dtype`` next to ``dtype``, and
    ``pad_token_id`` (transformers 5 saves it as ``_pad_token_id``; unread, Idefics3's default is outside this
    vocabulary)."""
    data = json.loads(config_path.read_text())
    for section in (data, data.get("text_config", {})):
        section["dtype"] = "float32"
        section["torch_dtype"] = "float32"
    data["pad_token_id"] = pad_token_id
    config_path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
