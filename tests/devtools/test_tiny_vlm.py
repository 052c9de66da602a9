"""The offline tiny vision-language model: loads with Auto* classes without torchvision, expands an image into
its 16 tokens, and is reused when already built."""

import json
from pathlib import Path

from PIL import Image
from transformers import AutoModelForImageTextToText, AutoProcessor

from ep_trl.devtools.tiny_vlm import FAKE_IMAGE, GLOBAL_IMAGE, IMAGE, IMAGE_SEQ_LEN, build_tiny_vlm
from tests.support.images import png_data_uri, user_with_image


def test_processor_and_model_load_and_an_image_becomes_its_tokens(tiny_vlm_dir: Path) -> None:
    processor = AutoProcessor.from_pretrained(tiny_vlm_dir)
    model = AutoModelForImageTextToText.from_pretrained(tiny_vlm_dir)
    assert (
        type(processor).__name__ == "Idefics3Processor" and type(model).__name__ == "Idefics3ForConditionalGeneration"
    )
    config = json.loads((tiny_vlm_dir / "config.json").read_text())
    assert config["text_config"]["vocab_size"] == len(processor.tokenizer) and config["pad_token_id"] == 0
    text = processor.apply_chat_template(
        [user_with_image("Click.", png_data_uri((9, 9, 9), (1280, 720)))], tokenize=False, add_generation_prompt=True
    )
    assert text == "<|im_start|>user\nClick.<image><|im_end|>\n<|im_start|>assistant\n"
    ids = processor(text=[text], images=[[Image.new("RGB", (1280, 720))]], add_special_tokens=False)["input_ids"][0]
    tok = processor.tokenizer
    expected = (
        [tok.convert_tokens_to_ids(t) for t in (FAKE_IMAGE, GLOBAL_IMAGE)]
        + [tok.convert_tokens_to_ids(IMAGE)] * IMAGE_SEQ_LEN
        + [tok.convert_tokens_to_ids(FAKE_IMAGE)]
    )
    at = ids.index(expected[0])
    assert ids[at : at + len(expected)] == expected and IMAGE_SEQ_LEN == 16


def test_a_finished_build_is_reused(tiny_vlm_dir: Path) -> None:
    weights = tiny_vlm_dir / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    assert build_tiny_vlm(tiny_vlm_dir, seed=0) == tiny_vlm_dir and weights.stat().st_mtime_ns == stamp
