"""OpenAI chat-completions messages as they arrive on the wire, as the chat template renders them, and as two
requests of one rollout are compared.

A processor sends back the conversation it holds, which ep_trl compares with what the rollout already holds. The
wire form varies without meaning anything (content ``None`` or ``""``, content parts, tool-call arguments as a JSON
string, ids that litellm or the processor add), so comparison uses a canonical form: role, content text, tool calls
as (name, decoded arguments); ids and reasoning are ignored. Rendering uses the template form: tool-call arguments
decoded to objects (a template given the wire's JSON string renders it encoded twice).
"""

import json
from collections.abc import Mapping

from ..trajectory.content import content_text
from ..trajectory.types import Message, Messages, MessagesView, MessageView, Tools

#: Message keys a chat template may read; others (litellm's ``function_call: None``, eval-protocol's fields) go.
_TEMPLATE_KEYS = ("role", "content", "tool_calls", "tool_call_id", "name")

Canonical = tuple[str, str, tuple[tuple[str, str], ...]]


def _arguments(value: object) -> object:
    """Tool-call arguments as an object: the wire carries a JSON string."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def _wire_arguments(value: object) -> str:
    """Tool-call arguments as the wire carries them: a JSON string."""
    return value if isinstance(value, str) else json.dumps(value if value is not None else {})


def _calls(message: MessageView) -> list[MessageView]:
    return [c for c in (message.get("tool_calls") or []) if isinstance(c, Mapping)]


def canonical(message: MessageView) -> Canonical:
    """What two messages must share to be the same turn of a conversation."""
    calls = tuple(
        (
            str((c.get("function") or {}).get("name")),
            json.dumps(_arguments((c.get("function") or {}).get("arguments")), sort_keys=True),
        )
        for c in _calls(message)
    )
    return str(message.get("role")), content_text(message.get("content")), calls


def template_form(messages: MessagesView) -> Messages:
    """Messages ready for the chat template: known keys only, tool-call arguments decoded."""
    out: Messages = []
    for message in messages:
        kept = {k: message[k] for k in _TEMPLATE_KEYS if message.get(k) is not None}
        if kept.get("content") is None:
            kept["content"] = ""
        if "tool_calls" in kept:
            kept["tool_calls"] = [
                {
                    "id": c.get("id"),
                    "type": c.get("type", "function"),
                    "function": {
                        "name": (c.get("function") or {}).get("name"),
                        "arguments": _arguments((c.get("function") or {}).get("arguments")),
                    },
                }
                for c in _calls(message)
            ]
        out.append(kept)
    return out


def tool_names(tools: Tools | None) -> set[str]:
    """The function names a request offers."""
    names = set()
    for tool in tools or ():
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if isinstance(function, Mapping) and function.get("name"):
            names.add(str(function["name"]))
    return names


def reply_message(parsed: MessageView, text: str, offered: set[str], call_id_prefix: str) -> Message:
    """The assistant message to return: the parsed tool calls that name an offered tool (arguments as the wire's
    JSON string), else the sampled ``text`` as content (a call to a tool that was not offered is text)."""
    calls = [
        c
        for c in parsed.get("tool_calls") or []
        if isinstance(c, Mapping) and (c.get("function") or {}).get("name") in offered
    ]
    if not calls:
        return {"role": "assistant", "content": text}
    return {
        "role": "assistant",
        "content": content_text(parsed.get("content")) or None,
        "tool_calls": [
            {
                "id": f"{call_id_prefix}-{k}",
                "type": "function",
                "function": {
                    "name": c["function"]["name"],
                    "arguments": _wire_arguments(c["function"].get("arguments")),
                },
            }
            for k, c in enumerate(calls)
        ],
    }
