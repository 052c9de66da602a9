"""The BrowserGym action parser on realistic model outputs.

Every action the parser produces is also fed to BrowserGym's own action parser
(the one the server runs), so "valid" here means "BrowserGym accepts it".
"""

import pytest
from browsergym.core.action.highlevel import HighLevelActionSet

from ep_trl.envs.browsergym.actions import FALLBACK_ACTION, browsergym_action_parser, parse_action
from ep_trl.envs.browsergym.config import DEFAULT_ACTION_SUBSETS
from ep_trl.envs.browsergym.models import BrowserGymAction

# (model output, expected action string); None means "falls back to noop()".
CASES: list[tuple[str, str | None]] = [
    ("click('13')", "click('13')"),
    ("Action: click('13')", "click('13')"),
    ('click("13")', "click('13')"),
    ("```python\nclick('13')\n```", "click('13')"),
    ('```\nAction: dblclick("22")\n```', "dblclick('22')"),
    (
        "The button labelled Submit has bid 13, so I will press it.\nAction: click('13')\nThis completes the task.",
        "click('13')",
    ),
    ("Thought: maybe click('4') first? No.\nAction: click('5')", "click('5')"),
    ("click('13')\nfill('14', 'abc')", "click('13')"),
    ("type('12', 'abc')", "fill('12', 'abc')"),
    ("fill('12', 'Hello, world (again)')", "fill('12', 'Hello, world (again)')"),
    ("fill(12, 42)", "fill('12', '42')"),
    ("send_keys('12', 'hello')", "fill('12', 'hello')"),
    ("click(13)", "click('13')"),
    ("click(a51)", "click('a51')"),
    ("CLICK('13')", "click('13')"),
    ("click(‘13’)", "click('13')"),
    ("browser.click('13')", "click('13')"),
    ("click(bid='13')", "click('13')"),
    ("click('13', button='right')", "click('13', button='right')"),
    ("press('12', 'Enter')", "press('12', 'Enter')"),
    ("press('Enter')", "keyboard_press('Enter')"),
    ("scroll(0, 200)", "scroll(0, 200)"),
    ("scroll('down')", "scroll(0, 200)"),
    ("noop()", "noop()"),
    ("hover('7')", "hover('7')"),
    ("select_option('5', 'Apple')", "select_option('5', 'Apple')"),
    ("focus('3')", "focus('3')"),
    ("clear('3')", "clear('3')"),
    ("mouse_click(10, 20)", "mouse_click(10, 20)"),
    ("click [13]", "click('13')"),
    ("type [12] [hello world]", "fill('12', 'hello world')"),
    ('{"action": "click", "bid": "13"}', "click('13')"),
    ("<tool_call>click('13')</tool_call>", "click('13')"),
    ("fill('12', \"it's\")", "fill('12', \"it's\")"),
    # garbage and near misses fall back
    ("", None),
    ("I don't know what to do here.", None),
    ("The answer is to click on 13", None),
    ("click()", None),
    ("fill('12')", None),
    ("click('13", None),
    ("click(x.y)", None),
]

_BROWSERGYM = HighLevelActionSet(subsets=list(DEFAULT_ACTION_SUBSETS), strict=False, multiaction=False)


@pytest.mark.parametrize(("output", "expected"), CASES, ids=[repr(c[0])[:40] for c in CASES])
def test_parse_action_table(output: str, expected: str | None) -> None:
    """Each realistic output maps to one canonical action, or to a flagged noop fallback."""
    parsed = parse_action(output)
    if expected is None:
        assert parsed.fell_back, parsed
        assert parsed.action_str == FALLBACK_ACTION
        assert parsed.reason, "a fallback must say why"
    else:
        assert not parsed.fell_back, parsed
        assert parsed.action_str == expected
    # BrowserGym itself must accept exactly one action from the string.
    code = _BROWSERGYM.to_python_code(parsed.action_str)
    assert parsed.action_str.split("(")[0] in code


def test_table_is_large_enough() -> None:
    """The brief asks for at least 20 realistic outputs including garbage."""
    assert len(CASES) >= 20
    assert sum(expected is None for _, expected in CASES) >= 5


def test_reason_describes_normalisation() -> None:
    """Normalisations are reported so logs show what the model actually wrote."""
    assert "mapped type to fill" in parse_action("type('12', 'abc')").reason
    assert "took the first of 2 actions" in parse_action("click('1')\nclick('2')").reason
    assert parse_action("click('13')").reason == ""
    assert "needs bid" in parse_action("click()").reason


def test_custom_fallback() -> None:
    """Callers can choose a cheaper fallback than noop()'s 1 s wait."""
    parsed = parse_action("nothing useful", fallback="noop(0)")
    assert parsed.action_str == "noop(0)"
    assert parsed.fell_back


def test_eval_protocol_parser_records_fallback() -> None:
    """The action_parser helper returns a BrowserGymAction whose metadata carries the outcome."""
    good = browsergym_action_parser("Action: click(13)")
    assert isinstance(good, BrowserGymAction)
    assert good.action_str == "click('13')"
    assert good.metadata["fell_back"] is False

    bad = browsergym_action_parser("no idea")
    assert bad.action_str == FALLBACK_ACTION
    assert bad.metadata["fell_back"] is True
    assert bad.metadata["parse_reason"]
    assert bad.metadata["raw_output"] == "no idea"


def test_eval_protocol_parser_accepts_content_parts_and_none() -> None:
    """eval-protocol may hand over None or OpenAI content parts instead of a string."""
    parts = [{"type": "text", "text": "Action:"}, {"type": "text", "text": "click('9')"}]
    assert browsergym_action_parser(parts).action_str == "click('9')"
    assert browsergym_action_parser(None).metadata["fell_back"] is True
