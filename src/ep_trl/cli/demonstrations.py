"""Demonstrations for ``ep-trl train --warm-start DEMOS.jsonl``, read and checked: one conversation per line, an
eval-protocol ``EvaluationRow`` as JSON (what ``ep logs`` stores and eval-protocol writes) or ``{"messages": [...],
"tools": [...]}``; tool calls may carry their ``arguments`` as a JSON string (the OpenAI shape) or as an object. A bad
line is refused naming its file, line and what is wrong, with how to record good ones
(``python -m ep_trl.devtools.record_demonstrations``). ``ep_trl.cli.warm_start`` trains on them."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError

#: How to make a demonstrations file.
RECORD_HINT = (
    "record one with `python -m ep_trl.devtools.record_demonstrations ENV_PATH --out DEMOS.jsonl "
    '--choices A,B,...` (docs/cli.md, "Warm start")'
)

#: What a line must be.
LINE_HINT = (
    "each line is an eval-protocol EvaluationRow as JSON (as `ep logs` stores it) or "
    '{"messages": [...], "tools": [...]}, with at least one assistant turn'
)


@dataclass(frozen=True)
class Demonstration:
    """One line of a demonstrations file: its messages in the chat template's form (known keys only, tool-call
    arguments as objects) and the tools offered with them (None: none)."""

    line: int
    messages: tuple[Mapping[str, object], ...]
    tools: tuple[Mapping[str, object], ...] | None


@dataclass(frozen=True)
class Demonstrations:
    """A demonstrations file, read and checked."""

    path: Path
    lines: tuple[Demonstration, ...]


def read_demonstrations(path: str | Path) -> Demonstrations:
    """The demonstrations in ``path`` (JSON lines), every line checked; :class:`ConfigError` naming the first line
    that is not a demonstration, and the fix."""
    file = Path(path).expanduser()
    where = f"--warm-start {path}"
    if not file.is_file():
        raise ConfigError(f"{where}: no such file; {RECORD_HINT}")
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"{where}: cannot be read ({error}); give a UTF-8 JSON-lines file ({LINE_HINT})") from error
    lines = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            lines.append(_demonstration(f"{where}, line {number}", number, line))
    if not lines:
        raise ConfigError(
            f"{where}: the file holds no demonstration; {LINE_HINT}. {RECORD_HINT[0].upper()}{RECORD_HINT[1:]}"
        )
    return Demonstrations(file, tuple(lines))


def _demonstration(where: str, number: int, line: str) -> Demonstration:
    from ..capture.wire import template_form

    try:
        loaded = json.loads(line)
    except json.JSONDecodeError as error:
        raise ConfigError(f"{where}: not JSON ({error}); {LINE_HINT}") from error
    if not isinstance(loaded, dict) or not isinstance(loaded.get("messages"), list) or not loaded["messages"]:
        raise ConfigError(f'{where}: no "messages" list; {LINE_HINT}')
    tools = loaded.get("tools")
    if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)):
        raise ConfigError(
            f'{where}: "tools" must be a list of tool schemas (as an OpenAI request carries them: '
            '{"type": "function", "function": {"name": ..., "parameters": ...}}) or absent'
        )
    for k, message in enumerate(loaded["messages"]):
        _check_message(f"{where}, message {k}", message)
    if not any(m["role"] == "assistant" for m in loaded["messages"]):
        raise ConfigError(f"{where}: no assistant turn, so nothing to train on; {LINE_HINT}")
    if loaded["messages"][0]["role"] == "assistant":
        raise ConfigError(
            f"{where}: begins with an assistant turn; a demonstration shows what the model answers, so "
            "it begins with the messages it is prompted with (system, user)"
        )
    return Demonstration(number, tuple(template_form(loaded["messages"])), tuple(tools) if tools else None)


def _check_message(where: str, message: object) -> None:
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise ConfigError(f'{where}: not a message (an object with a "role" and "content")')
    content = message.get("content")
    if content is not None and not isinstance(content, str | list):
        raise ConfigError(f'{where}: "content" must be a string, a list of content parts or null')
    calls = message.get("tool_calls")
    if calls is None:
        if message["role"] == "assistant" and not content:
            raise ConfigError(
                f"{where}: an assistant turn with neither content nor tool calls; drop the line or "
                "give the turn what the model should write"
            )
        return
    if not isinstance(calls, list) or not calls:
        raise ConfigError(
            f'{where}: "tool_calls" must be a non-empty list of {{"function": {{"name": ..., "arguments": ...}}}}'
        )
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise ConfigError(
                f"{where}: a tool call without a function name; write "
                '{"type": "function", "function": {"name": ..., "arguments": ...}}'
            )
        arguments = function.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError as error:
                raise ConfigError(
                    f"{where}: tool call {function['name']!r} has arguments {arguments!r}, which are "
                    f"not JSON ({error}); give a JSON object or its JSON string"
                ) from error
        if not isinstance(arguments, dict):
            raise ConfigError(
                f"{where}: tool call {function['name']!r} has arguments {arguments!r}; give a JSON "
                'object (or its JSON string), e.g. {"action": "LEFT"}'
            )
