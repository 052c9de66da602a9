"""Content parts from prompt builders reach the chat template: as text for text models, as images for processors."""

import logging
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from ep_trl.trajectory.content import content_text, supports_images, template_messages
from ep_trl.trajectory.template import ChatTemplate
from tests.support.images import png_data_uri

SCREENSHOT = png_data_uri((200, 30, 30))
PARTS = [
    {"type": "text", "text": "Goal: click the button."},
    {"type": "image_url", "image_url": {"url": SCREENSHOT}},
    {"type": "text", "text": "Answer with one action."},
]
MESSAGES: list[dict[str, Any]] = [
    {"role": "system", "content": "You operate a browser."},
    {"role": "user", "content": PARTS},
]

#: A ChatML template that renders image parts as the processor's image token (written for this test).
IMAGE_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for p in m['content'] %}"
    "{% if p['type'] == 'image' %}<image>{% elif p['type'] == 'text' %}{{ p['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_content_text_flattens_strings_parts_and_none() -> None:
    assert content_text("Goal: click the button.") == "Goal: click the button."
    assert content_text(None) == ""
    assert content_text(PARTS) == "Goal: click the button.\nAnswer with one action."  # the image adds nothing
    assert content_text(["plain", {"type": "text", "text": ""}, {"type": "text", "text": "parts"}]) == "plain\nparts"
    assert content_text([{"type": "image_url", "image_url": {"url": SCREENSHOT}}]) == ""


def test_content_text_reads_eval_protocols_part_models() -> None:
    from eval_protocol.models import ChatCompletionContentPartTextParam

    parts = [ChatCompletionContentPartTextParam(text="from a"), ChatCompletionContentPartTextParam(text="model")]
    assert content_text(parts) == "from a\nmodel"


def test_text_only_join_text_parts_and_count_dropped_images() -> None:
    out, dropped = template_messages(MESSAGES, images=False)
    assert out[0] == MESSAGES[0]
    assert out[1]["content"] == "Goal: click the button.\nAnswer with one action."
    assert dropped == 1
    assert MESSAGES[1]["content"] is PARTS  # the caller's messages are not modified


def test_multimodal_turns_openai_image_parts_into_hf_image_parts() -> None:
    out, dropped = template_messages(MESSAGES, images=True)
    assert dropped == 0
    assert out[1]["content"] == [
        {"type": "text", "text": "Goal: click the button."},
        {"type": "image", "url": SCREENSHOT},
        {"type": "text", "text": "Answer with one action."},
    ]


def test_unknown_part_type_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unsupported message content part type 'audio'"):
        template_messages([{"role": "user", "content": [{"type": "audio", "audio": "x"}]}], images=True)


def test_text_tokenizer_renders_parts_as_text_and_warns_once(
    tiny_model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert not supports_images(tok)
    template = ChatTemplate(tok)
    with caplog.at_level(logging.WARNING, logger="ep_trl.trajectory.template"):
        text = template.render(MESSAGES)
        template.render(MESSAGES)
    assert "<|im_start|>user\nGoal: click the button.\nAnswer with one action.<|im_end|>" in text
    assert "image_url" not in text and "base64" not in text
    assert sum("images are dropped" in r.getMessage() for r in caplog.records) == 1


def test_multimodal_processor_gets_the_image_part_and_expands_its_placeholder(tiny_model_dir: Path) -> None:
    from transformers import LlavaProcessor
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.add_special_tokens({"additional_special_tokens": ["<image>"]})
    processor = LlavaProcessor(
        image_processor=CLIPImageProcessorPil(), tokenizer=tok, chat_template=IMAGE_TEMPLATE, patch_size=14
    )
    assert supports_images(processor)
    template = ChatTemplate(processor)
    text = template.render(MESSAGES)
    assert "<|im_start|>user\nGoal: click the button.<image>Answer with one action.<|im_end|>" in text
    image_token = tok.convert_tokens_to_ids("<image>")
    prompt = template.prompt(MESSAGES)
    expected = processor(text=[text], images=[prompt.images[0]], add_special_tokens=False)["input_ids"][0]
    assert list(prompt.ids) == expected and prompt.ids.count(image_token) > 1  # one token per patch, not one per image
    assert prompt.unexpanded_ids == tuple(template.encode(text)) and prompt.unexpanded_ids.count(image_token) == 1
    assert len(prompt.images) == 1 and prompt.images[0].getpixel((0, 0)) == (200, 30, 30)
    assert template.prompt_ids(MESSAGES) == list(prompt.ids)
