"""Message content as the chat template needs it: OpenAI-style content parts to text, or to the processor's parts.

Prompt builders may return a string or OpenAI-style content parts (``{"type": "text", ...}``,
``{"type": "image_url", "image_url": {"url": ...}}``), as eval-protocol passes them to the model unchanged.
Chat templates differ: a text tokenizer's template expects a string (most render a list as its Python repr), while
a multimodal processor's template (Qwen2-VL, Qwen3-VL, ...) expects Hugging Face parts (``{"type": "image", ...}``)
and emits its image placeholder tokens for them. This module converts one into the other, so the same eval feeds
both kinds of model. See docs/browsergym.md ("Vision-language models") for what TRL's rollout_func path still
lacks to train on the images themselves.
"""

from collections.abc import Mapping, Sequence
from typing import Any

_IMAGE_TYPES = ("image_url", "image", "input_image")


def supports_images(processing_class: Any) -> bool:
    """Whether the trainer's processing class is a multimodal processor (it has an image processor)."""
    return getattr(processing_class, "image_processor", None) is not None


def template_messages(messages: Sequence[Mapping[str, Any]], *, images: bool) -> tuple[list[dict[str, Any]], int]:
    """Messages ready for ``apply_chat_template``, and how many image parts were dropped.

    String content is left as is. Content parts become Hugging Face parts when ``images`` is true (text stays
    text; an OpenAI ``image_url`` part becomes ``{"type": "image", "url": ...}``), or, for text-only templates,
    their text parts joined by newlines with the image parts dropped (and counted).
    """
    out: list[dict[str, Any]] = []
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
            out.append({**message, "content": "\n".join(p["text"] for p in parts if p["type"] == "text")})
    return out, dropped


def _part(part: Any) -> dict[str, Any]:
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
