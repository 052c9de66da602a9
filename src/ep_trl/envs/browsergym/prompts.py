"""Prompts for BrowserGym MiniWoB++ episodes.

``build_prompt`` matches eval-protocol's ``prompt_builder(observation, step, history)``
contract and returns plain text. ``build_prompt_parts`` returns the same text as
OpenAI-style content parts plus the screenshot as an ``image_url`` data URI, so a
multimodal processor can take the image later without a second prompt design;
``build_user_content`` picks between the two depending on whether a screenshot
is present.

Observations may be ``BrowserGymObservation`` objects or plain dicts (e.g. from
logs), so fields are read by name from either.
"""

from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlparse

#: Characters of accessibility tree shown per turn; MiniWoB pages fit easily, bigger
#: pages are cut so one turn cannot blow the context budget.
DEFAULT_MAX_AXTREE_CHARS = 3000
#: Most recent history lines shown (older ones are summarised as a count).
DEFAULT_MAX_HISTORY = 10
#: Most clickable ids listed explicitly.
_MAX_CLICKABLE_LISTED = 40

SYSTEM_PROMPT = """You operate a web browser to complete a task on a small web page.
Each turn shows the task goal, the page's accessibility tree (elements carry ids in square brackets,
e.g. [13]), the error of your last action if any, and your previous actions.
Answer with exactly one action written as a function call, for example:
click('13')  - click element 13
fill('12', 'some text')  - replace the text of input 12
press('12', 'Enter')  - press a key while element 12 is focused
select_option('5', 'Apple')  - choose an option of select 5
hover('7'), dblclick('9'), focus('3'), clear('3')
scroll(0, 200)  - scroll the page down by 200 pixels
noop()  - do nothing this turn
Use only ids that appear in the tree, quote them, and write nothing but the action, e.g.: click('13')"""


def build_prompt(
    observation: Any,
    step: int,
    history: Sequence[str],
    *,
    max_axtree_chars: int = DEFAULT_MAX_AXTREE_CHARS,
    max_history: int = DEFAULT_MAX_HISTORY,
) -> str:
    """User message text for one turn: goal, URL, last error, bounded axtree, recent history."""
    goal = str(_field(observation, "goal", "")).strip() or "(no goal given)"
    lines = [f"Step {step}", f"Goal: {goal}"]
    url = str(_field(observation, "url", ""))
    if url:
        lines.append(f"URL: {_display_url(url)}")
    error = str(_field(observation, "last_action_error", "") or "").strip()
    if error:
        lines.append(f"Last action error: {error}")
    clickable = [str(bid) for bid in (_field(observation, "clickable_bids", None) or [])]
    if clickable:
        shown = ", ".join(clickable[:_MAX_CLICKABLE_LISTED])
        more = f" (+{len(clickable) - _MAX_CLICKABLE_LISTED} more)" if len(clickable) > _MAX_CLICKABLE_LISTED else ""
        lines.append(f"Clickable element ids: {shown}{more}")
    axtree = str(_field(observation, "axtree_txt", "") or "").strip()
    if url and url != _display_url(url):
        axtree = axtree.replace(url, _display_url(url))  # the root node repeats the page URL
    lines.append("Accessibility tree:")
    lines.append(_truncate(axtree, max_axtree_chars) if axtree else "(empty)")
    lines.append("Previous actions:")
    lines.extend(_recent_history(history, max_history))
    lines.append("Answer with exactly one action, e.g. click('13').")
    return "\n".join(lines)


def build_prompt_parts(
    observation: Any,
    step: int,
    history: Sequence[str],
    **prompt_kwargs: Any,
) -> list[dict[str, Any]]:
    """OpenAI-style content parts: the prompt text, then the screenshot (if any) as a PNG data URI."""
    parts: list[dict[str, Any]] = [{"type": "text", "text": build_prompt(observation, step, history, **prompt_kwargs)}]
    screenshot = _field(observation, "screenshot", None)
    if screenshot:
        parts.append({"type": "image_url", "image_url": {"url": f"data:image/png;base64,{screenshot}"}})
    return parts


def build_user_content(
    observation: Any,
    step: int,
    history: Sequence[str],
    **prompt_kwargs: Any,
) -> str | list[dict[str, Any]]:
    """Plain text when there is no screenshot (what text-only models need), content parts when there is."""
    if _field(observation, "screenshot", None):
        return build_prompt_parts(observation, step, history, **prompt_kwargs)
    return build_prompt(observation, step, history, **prompt_kwargs)


def _field(observation: Any, name: str, default: Any) -> Any:
    """Read a field from an observation model or a dict."""
    if isinstance(observation, Mapping):
        return observation.get(name, default)
    return getattr(observation, name, default)


def _display_url(url: str) -> str:
    """Local ``file://`` task pages are shown by file name: the machine path is noise to the model."""
    parsed = urlparse(url)
    if parsed.scheme == "file":
        return parsed.path.rsplit("/", 1)[-1] or url
    return url


def _truncate(text: str, max_chars: int) -> str:
    """Cut ``text`` at a line boundary within ``max_chars`` and say how much was dropped."""
    if len(text) <= max_chars:
        return text
    cut = text.rfind("\n", 0, max_chars)
    cut = cut if cut > 0 else max_chars
    return f"{text[:cut]}\n... ({len(text) - cut} more characters of the tree omitted)"


def _recent_history(history: Sequence[str], max_history: int) -> list[str]:
    """The last ``max_history`` history lines, with a count of the omitted older ones."""
    if not history:
        return ["(none yet)"]
    recent = list(history)[-max_history:] if max_history > 0 else []
    omitted = len(history) - len(recent)
    return ([f"({omitted} earlier steps omitted)"] if omitted else []) + [str(line) for line in recent]
