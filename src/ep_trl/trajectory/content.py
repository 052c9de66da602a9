"""Message content as the chat template needs it: OpenAI-style content parts to text, or to the processing class's
parts.

Prompt builders may return a string or OpenAI-style content parts (``{"type": "text", ...}``,
``{"type": "image_url", "image_url": {"url": ...}}``), as eval-protocol passes them to the model unchanged.
Chat templates differ: a text tokenizer's template expects a string (most render a list as its Python repr), while
a multimodal processing class's template (Qwen2-VL, Qwen3-VL, ...) expects Hugging Face parts (``{"type": "image",
...}``) and emits its image placeholder tokens for them. This module converts one into the other, so the same eval feeds
both kinds of model, flattens any message content to its text (:func:`content_text`), and gives the image parts'
images, in the order the template places them, to the processing class that expands each placeholder
(docs/browsergym.md, "Vision-language models").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeGuard, cast

from .types import (
    Image,
    Message,
    Messages,
    MessagesView,
    MessageView,
    MultimodalProcessingClass,
    ProcessingClass,
    Tokenizer,
)

_IMAGE_TYPES = ("image_url", "image", "input_image")


def supports_images(processing_class: ProcessingClass) -> TypeGuard[MultimodalProcessingClass]:
    """Whether the trainer's processing class is a multimodal processing class (it has an image processor)."""
    return getattr(processing_class, "image_processor", None) is not None


def tokenizer_of(processing_class: ProcessingClass) -> Tokenizer:
    """The text tokenizer: a multimodal processing class's ``.tokenizer``, else the processing class itself."""
    return cast(Tokenizer, getattr(processing_class, "tokenizer", processing_class))


def content_text(content: object) -> str:
    """A message content's text: a string as it is, ``None`` as ``""``, content parts (mappings, eval-protocol's part
    models or strings) as their texts joined by newlines; parts without text (images) add nothing.

    Newlines, as a text-only chat template receives the parts (:func:`template_messages`): text parts are separate
    paragraphs of one message, and their words must not run together for a reader (the model, an action parser)
    or in a comparison of two messages' text.
    """
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        texts = [
            p if isinstance(p, str) else p.get("text") if isinstance(p, Mapping) else getattr(p, "text", None)
            for p in content
        ]
        return "\n".join(str(t) for t in texts if t)
    return str(content)


def template_messages(messages: MessagesView, *, images: bool) -> tuple[Messages, int]:
    """Messages ready for ``apply_chat_template``, and how many image parts were dropped.

    String content is left as is. Content parts become Hugging Face parts when ``images`` is true (text stays
    text; an OpenAI ``image_url`` part becomes ``{"type": "image", "url": ...}``), or, for text-only templates,
    their text (:func:`content_text`) with the image parts dropped (and counted).
    """
    out: Messages = []
    dropped = 0
    for message in messages:
        content = message.get("content")
        if isinstance(content, str) or content is None:
            out.append(dict(message))
            continue
        parts = [_part(p) for p in content]
        if images:
            out.append({**message, "content": parts})
        else:
            dropped += sum(p["type"] == "image" for p in parts)
            out.append({**message, "content": content_text(parts)})
    return out, dropped


def image_parts(messages: MessagesView) -> list[MessageView]:
    """The Hugging Face image parts of messages converted by :func:`template_messages`, in message and part order
    (the order a chat template writes their placeholders in)."""
    return [
        part
        for message in messages
        if isinstance(message.get("content"), list)
        for part in message["content"]
        if part.get("type") == "image"
    ]


def image_source(part: MessageView) -> str | Image:
    """What an image part points at: a PIL image (``image``), or a data URI, URL or path (``url``, ``path``)."""
    for key in ("image", "url", "path"):
        if part.get(key) is not None:
            return part[key]
    raise ValueError(f"image content part without an image, url or path: {dict(part)!r}")


def load_image(source: str | Image) -> Image:
    """A PIL image from an image part's source (data URIs included; transformers' own loader)."""
    from transformers.image_utils import load_image as _load

    return _load(source)


def _part(part: object) -> Message:
    """One content part in Hugging Face form: ``{"type": "text", "text"}`` or ``{"type": "image", ...}``."""
    if isinstance(part, str):
        return {"type": "text", "text": part}
    if not isinstance(part, Mapping):
        raise TypeError(f"a message content part must be a string or a mapping, not {type(part).__name__}")
    kind = part.get("type")
    if kind == "text":
        return {"type": "text", "text": str(part.get("text", ""))}
    if kind in _IMAGE_TYPES:
        if kind == "image":
            return dict(part)
        source = part.get(kind)
        url = source.get("url") if isinstance(source, Mapping) else source
        if not url:
            raise ValueError(f"image content part without a URL: {dict(part)!r}")
        return {"type": "image", "url": str(url)}
    raise ValueError(
        f"unsupported message content part type {kind!r}; prompt builders may return text and image parts "
        f"(types 'text', {', '.join(repr(t) for t in _IMAGE_TYPES)})"
    )
