"""Turn free-form model output into exactly one BrowserGym action string.

Small models rarely answer with a bare ``click('13')``: they wrap it in prose,
code fences, ``Action:`` labels, JSON, WebArena-style ``click [13]``, use
``type`` instead of ``fill`` or forget to quote ids. BrowserGym's own parser
would then execute several actions or fail with an opaque error, so this module
normalises the output first and falls back to ``noop()`` (flagged, with a
reason) when nothing usable is found, which keeps episodes running and lets the
trainer see how often the model produced no valid action.

Only the standard library is used: rollout workers import this without
BrowserGym or Playwright installed.
"""

import ast
import json
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

from ep_trl.envs.browsergym.models import BrowserGymAction
from ep_trl.trajectory.content import content_text

logger = logging.getLogger(__name__)

#: What the environment executes when the output holds no usable action.
#: BrowserGym's ``noop()`` waits 1000 ms, so pass ``fallback="noop(0)"`` for speed.
FALLBACK_ACTION = "noop()"

#: Longest raw output kept in action metadata (enough to debug, bounded for logs).
_MAX_RAW_IN_METADATA = 500


@dataclass(frozen=True)
class ParsedAction:
    """Result of :func:`parse_action`.

    ``reason`` says what was normalised (empty when the output was already a
    single canonical action) or, when ``fell_back`` is true, why nothing parsed.
    """

    action_str: str
    fell_back: bool
    reason: str


@dataclass(frozen=True)
class _Spec:
    """Signature of one BrowserGym action: parameter names and their kinds."""

    params: tuple[str, ...]
    required: int
    bids: frozenset[int] = field(default_factory=frozenset)  # element ids, sent as strings
    texts: frozenset[int] = field(default_factory=frozenset)  # free text, sent as strings
    numbers: frozenset[int] = field(default_factory=frozenset)  # coordinates, deltas, times


def _bid_action(*params: str, required: int = 1, texts: Sequence[int] = ()) -> _Spec:
    """Spec of an action whose first parameter is an element id."""
    return _Spec(params=params, required=required, bids=frozenset({0}), texts=frozenset(texts))


def _xy_action(*params: str, required: int) -> _Spec:
    """Spec of a coordinate action (all required parameters are numbers)."""
    return _Spec(params=params, required=required, numbers=frozenset(range(required)))


#: BrowserGym high-level actions (browsergym/core/action/functions.py) and their parameters.
ACTION_SPECS: dict[str, _Spec] = {
    "click": _bid_action("bid", "button", "modifiers"),
    "dblclick": _bid_action("bid", "button", "modifiers"),
    "hover": _bid_action("bid"),
    "focus": _bid_action("bid"),
    "clear": _bid_action("bid"),
    "check": _bid_action("bid"),
    "uncheck": _bid_action("bid"),
    "fill": _bid_action("bid", "value", "enable_autocomplete_menu", required=2, texts=(1,)),
    "press": _bid_action("bid", "key_comb", required=2, texts=(1,)),
    "select_option": _bid_action("bid", "options", required=2),
    "upload_file": _bid_action("bid", "file", required=2),
    "drag_and_drop": _Spec(params=("from_bid", "to_bid"), required=2, bids=frozenset({0, 1})),
    "scroll": _Spec(params=("delta_x", "delta_y"), required=2, numbers=frozenset({0, 1})),
    "noop": _Spec(params=("wait_ms",), required=0, numbers=frozenset({0})),
    "send_msg_to_user": _Spec(params=("text",), required=1, texts=frozenset({0})),
    "report_infeasible": _Spec(params=("reason",), required=1, texts=frozenset({0})),
    "mouse_click": _xy_action("x", "y", "button", required=2),
    "mouse_dblclick": _xy_action("x", "y", "button", required=2),
    "mouse_down": _xy_action("x", "y", "button", required=2),
    "mouse_up": _xy_action("x", "y", "button", required=2),
    "mouse_move": _xy_action("x", "y", required=2),
    "mouse_drag_and_drop": _xy_action("from_x", "from_y", "to_x", "to_y", required=4),
    "scroll_at": _xy_action("x", "y", "dx", "dy", required=4),
    "keyboard_press": _Spec(params=("key",), required=1, texts=frozenset({0})),
    "keyboard_down": _Spec(params=("key",), required=1, texts=frozenset({0})),
    "keyboard_up": _Spec(params=("key",), required=1, texts=frozenset({0})),
    "keyboard_type": _Spec(params=("text",), required=1, texts=frozenset({0})),
    "keyboard_insert_text": _Spec(params=("text",), required=1, texts=frozenset({0})),
    "goto": _Spec(params=("url",), required=1, texts=frozenset({0})),
    "go_back": _Spec(params=(), required=0),
    "go_forward": _Spec(params=(), required=0),
    "new_tab": _Spec(params=(), required=0),
    "tab_close": _Spec(params=(), required=0),
    "tab_focus": _Spec(params=("index",), required=1, numbers=frozenset({0})),
}

#: Names models use for BrowserGym actions (Selenium, WebArena, plain English).
ACTION_ALIASES: dict[str, str] = {
    "type": "fill",
    "send_keys": "fill",
    "type_text": "fill",
    "input_text": "fill",
    "enter_text": "fill",
    "double_click": "dblclick",
    "select": "select_option",
    "wait": "noop",
}

#: One-argument forms that mean a page-level keyboard action, e.g. ``press('Enter')``.
_ONE_ARG_KEYBOARD = {"press": "keyboard_press", "type": "keyboard_type", "send_keys": "keyboard_type"}

#: Keyword names models use for an element id / the text to type.
_BID_KEYWORDS = ("bid", "element", "element_id", "elem", "id", "ref")
_TEXT_KEYWORDS = ("value", "text", "content", "key", "key_comb", "keys")

#: ``scroll('down')`` and friends: (delta_x, delta_y) in pixels.
_SCROLL_WORDS = {"down": (0, 200), "up": (0, -200), "right": (200, 0), "left": (-200, 0)}

_ALL_NAMES = sorted(set(ACTION_SPECS) | set(ACTION_ALIASES), key=len, reverse=True)
_NAME_ALT = "|".join(re.escape(name) for name in _ALL_NAMES)
# A call: the name must not continue a longer identifier (mouse_click is not click),
# but may follow a dot (browser.click(...)).
_CALL_RE = re.compile(rf"(?<![A-Za-z0-9_])({_NAME_ALT})\s*\(", re.IGNORECASE)
# WebArena style: click [13], type [12] [hello world]
_BRACKET_RE = re.compile(rf"(?<![A-Za-z0-9_])({_NAME_ALT})\s*((?:\[[^\]\n]*\][ \t]*)+)", re.IGNORECASE)
_FENCE_RE = re.compile(r"```[A-Za-z0-9_+-]*[ \t]*\n?(.*?)```", re.DOTALL)
_ACTION_LABEL_RE = re.compile(r"\baction\s*[:=]", re.IGNORECASE)
_BARE_TOKEN_RE = re.compile(r"^\s*([A-Za-z0-9_-]+)\s*$")
_SMART_QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"'})


class _Invalid(ValueError):
    """A recognised action name whose arguments cannot be made valid."""


def parse_action(text: Optional[str], fallback: str = FALLBACK_ACTION) -> ParsedAction:
    """Extract the first valid BrowserGym action from model output.

    Regions are searched in order: fenced code blocks, the text after the first
    ``Action:`` label, then the whole output; within a region the first call
    that can be made valid wins (later ones are ignored and noted in
    ``reason``). Returns ``fallback`` with ``fell_back=True`` when none is found.
    """
    if text is None or not text.strip():
        return ParsedAction(fallback, True, "empty model output")
    cleaned = text.translate(_SMART_QUOTES)
    first_problem = ""
    for region in _regions(cleaned):
        action, notes, problem = _first_action_in(region)
        if action is not None:
            return ParsedAction(action, False, "; ".join(dict.fromkeys(notes)))
        first_problem = first_problem or problem
    reason = first_problem or "no BrowserGym action call found in model output"
    return ParsedAction(fallback, True, reason)


def browsergym_action_parser(text: Any, fallback: str = FALLBACK_ACTION) -> BrowserGymAction:
    """eval-protocol ``action_parser``: model message content -> BrowserGymAction.

    Accepts the raw content eval-protocol hands over (a string, None, or a list
    of OpenAI content parts) and records the parse outcome in the action's
    metadata (``fell_back``, ``parse_reason``, truncated ``raw_output``) so the
    fallback rate is visible in the server's observations and in logs.
    ``fallback`` is sent when nothing parses; ``"noop(0)"`` skips ``noop()``'s
    1 s wait, which matters when an untrained model rarely writes an action.
    """
    content = content_text(text)
    parsed = parse_action(content, fallback=fallback)
    if parsed.fell_back:
        logger.debug("No valid action in model output (%s); sending %s", parsed.reason, parsed.action_str)
    return BrowserGymAction(
        action_str=parsed.action_str,
        metadata={
            "fell_back": parsed.fell_back,
            "parse_reason": parsed.reason,
            "raw_output": content[:_MAX_RAW_IN_METADATA],
        },
    )


def _regions(text: str) -> list[str]:
    """Places to look for the action, most specific first."""
    regions = [block for block in _FENCE_RE.findall(text) if block.strip()]
    label = _ACTION_LABEL_RE.search(text)
    if label:
        regions.append(text[label.end() :])
    regions.append(text)
    return regions


def _first_action_in(region: str) -> tuple[Optional[str], list[str], str]:
    """First valid action in ``region``: (action or None, normalisation notes, first problem)."""
    candidates = sorted(
        [(m.start(), "call", m) for m in _CALL_RE.finditer(region)]
        + [(m.start(), "bracket", m) for m in _BRACKET_RE.finditer(region)],
        key=lambda item: item[0],
    )
    first_problem = ""
    for _, kind, match in candidates:
        try:
            if kind == "call":
                action, notes, end = _from_call(region, match)
            else:
                action, notes = _from_brackets(match)
                end = match.end()
        except _Invalid as exc:
            first_problem = first_problem or str(exc)
            continue
        later = len({start for start, _, _ in candidates if start >= end})
        if later:
            notes.append(f"took the first of {later + 1} actions")
        return action, notes, ""
    if not candidates:
        json_action = _from_json(region)
        if json_action is not None:
            return json_action
    return None, [], first_problem


def _from_call(region: str, match: re.Match[str]) -> tuple[str, list[str], int]:
    """Normalise a Python-style call ``name(args)`` found at ``match``; also return where it ends."""
    open_index = match.end() - 1
    close_index = _matching_paren(region, open_index)
    if close_index is None:
        raise _Invalid(f"{match.group(1)}( is never closed")
    inner = region[open_index + 1 : close_index]
    args, kwargs, notes = _literal_arguments(match.group(1), inner)
    action, notes = _normalise(match.group(1), args, kwargs, notes)
    return action, notes, close_index + 1


def _from_brackets(match: re.Match[str]) -> tuple[str, list[str]]:
    """Normalise a WebArena-style ``name [arg] [arg]`` command."""
    args: list[Any] = [value.strip() for value in re.findall(r"\[([^\]\n]*)\]", match.group(2))]
    return _normalise(match.group(1), args, {}, ["converted bracket syntax"])


def _from_json(region: str) -> Optional[tuple[Optional[str], list[str], str]]:
    """Normalise a JSON object like ``{"action": "click", "bid": "13"}``; None if not one."""
    start = region.find("{")
    end = region.rfind("}")
    if start < 0 or end <= start:
        return None
    try:
        obj = json.loads(region[start : end + 1])
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict):
        return None
    for key in ("action", "action_type", "name", "function", "type"):
        name = obj.get(key)
        if isinstance(name, str) and name.strip():
            break
    else:
        return None
    raw_args = obj.get("args", obj.get("arguments"))
    args: list[Any] = list(raw_args) if isinstance(raw_args, list) else []
    kwargs = {k: v for k, v in obj.items() if k not in (key, "args", "arguments", "thought", "reasoning")}
    if isinstance(raw_args, dict):
        kwargs.update(raw_args)
    try:
        action, notes = _normalise(name.strip(), args, kwargs, ["converted JSON object"])
    except _Invalid as exc:
        return None, [], str(exc)
    return action, notes, ""


def _matching_paren(text: str, open_index: int) -> Optional[int]:
    """Index of the bracket closing ``text[open_index]``, skipping quoted strings."""
    closers = {"(": ")", "[": "]", "{": "}"}
    stack: list[str] = []
    quote: Optional[str] = None
    i = open_index
    while i < len(text):
        char = text[i]
        if quote:
            if char == "\\":
                i += 2
                continue
            if char == quote:
                quote = None
        elif char in ("'", '"'):
            quote = char
        elif char in closers:
            stack.append(closers[char])
        elif stack and char == stack[-1]:
            stack.pop()
            if not stack:
                return i
        i += 1
    return None


def _literal_arguments(name: str, inner: str) -> tuple[list[Any], dict[str, Any], list[str]]:
    """Evaluate the argument list of a call as literals; bare identifiers become strings."""
    if not inner.strip():
        return [], {}, []
    try:
        call = ast.parse(f"f({inner})", mode="eval").body
    except SyntaxError:
        bare = _BARE_TOKEN_RE.match(inner)
        if bare:  # e.g. click(13a): not Python, but clearly one id
            return [bare.group(1)], {}, ["quoted a bare argument"]
        raise _Invalid(f"cannot read the arguments of {name}({inner})") from None
    assert isinstance(call, ast.Call)
    notes: list[str] = []
    args = [_literal(name, node, notes) for node in call.args]
    kwargs = {kw.arg: _literal(name, kw.value, notes) for kw in call.keywords if kw.arg}
    return args, kwargs, notes


def _literal(name: str, node: ast.expr, notes: list[str]) -> Any:
    """Value of one argument node; a bare name like ``a51`` is taken as the string 'a51'."""
    if isinstance(node, ast.Name):
        notes.append("quoted a bare argument")
        return node.id
    try:
        return ast.literal_eval(node)
    except ValueError:
        raise _Invalid(f"{name}() has a non-literal argument: {ast.unparse(node)}") from None


def _normalise(raw_name: str, args: list[Any], kwargs: dict[str, Any], notes: list[str]) -> tuple[str, list[str]]:
    """Map aliases, bind arguments to the action's parameters, coerce types, render canonically."""
    name = raw_name.lower()
    if name != raw_name:
        notes.append(f"lower-cased {raw_name}")
    if name in _ONE_ARG_KEYBOARD and len(args) + len(kwargs) == 1:
        canonical = _ONE_ARG_KEYBOARD[name]
        notes.append(f"mapped one-argument {name} to {canonical}")
        name = canonical
        if kwargs:
            args, kwargs = [next(iter(kwargs.values()))], {}
    elif name in ACTION_ALIASES:
        notes.append(f"mapped {name} to {ACTION_ALIASES[name]}")
        name = ACTION_ALIASES[name]
    spec = ACTION_SPECS[name]
    if name == "scroll" and len(args) == 1 and str(args[0]).lower() in _SCROLL_WORDS:
        notes.append(f"mapped scroll {args[0]!r} to pixel deltas")
        args = list(_SCROLL_WORDS[str(args[0]).lower()])

    values = _bind(name, spec, args, kwargs, notes)
    rendered_args = []
    for index, param in enumerate(spec.params):
        if param not in values:
            continue
        value = _coerce(name, spec, index, values[param], notes)
        rendered = _render(value)
        rendered_args.append(rendered if index < spec.required else f"{param}={rendered}")
    return f"{name}({', '.join(rendered_args)})", notes


def _bind(name: str, spec: _Spec, args: list[Any], kwargs: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    """Assign positional and keyword arguments to parameter names; error if a required one is missing."""
    if len(args) > len(spec.params):
        notes.append(f"dropped {len(args) - len(spec.params)} extra argument(s)")
        args = args[: len(spec.params)]
    values: dict[str, Any] = dict(zip(spec.params, args))
    for key, value in kwargs.items():
        param = _keyword_param(spec, key, values)
        if param is None:
            notes.append(f"dropped unknown argument {key}=")
        else:
            values[param] = value
    missing = [p for p in spec.params[: spec.required] if p not in values]
    if missing:
        raise _Invalid(f"{name}() needs {', '.join(missing)}")
    return values


def _keyword_param(spec: _Spec, key: str, bound: dict[str, Any]) -> Optional[str]:
    """Parameter a keyword argument belongs to, accepting common synonyms; None if unknown."""
    if key in spec.params:
        return key
    if key in _BID_KEYWORDS and spec.bids and spec.params[0] not in bound:
        return spec.params[0]
    if key in _TEXT_KEYWORDS:
        for index in sorted(spec.texts):
            if spec.params[index] not in bound:
                return spec.params[index]
    return None


def _coerce(name: str, spec: _Spec, index: int, value: Any, notes: list[str]) -> Any:
    """Give one argument the type BrowserGym expects (ids and text as str, coordinates as numbers)."""
    if index in spec.bids:
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise _Invalid(f"{name}() element id must be a string, got {value!r}")
        if not isinstance(value, str):
            notes.append("quoted a numeric element id")
            value = str(int(value)) if float(value).is_integer() else str(value)
        value = value.strip().strip("[]")
        if not value:
            raise _Invalid(f"{name}() got an empty element id")
        return value
    if index in spec.texts and not isinstance(value, str):
        notes.append(f"converted {spec.params[index]} to text")
        return str(value)
    if index in spec.numbers and isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            raise _Invalid(f"{name}() {spec.params[index]} must be a number, got {value!r}") from None
        notes.append(f"converted {spec.params[index]} to a number")
        return int(number) if number.is_integer() else number
    return value


def _render(value: Any) -> str:
    """Python-literal text BrowserGym's parser reads back (repr quotes strings safely)."""
    return repr(value)
