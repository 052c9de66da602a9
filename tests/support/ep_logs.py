"""Run eval-protocol's ``ep logs`` UI on a free loopback port and look at it with headless Debian Chromium."""

import json
import sys
import time
import urllib.parse
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ep_trl.runtime.processes import ServerProcess, free_port, start_server

#: Debian's chromium; playwright 1.44's own build cannot be downloaded here (see scripts/install_browser.sh).
CHROMIUM = "/usr/lib/chromium/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def start_ep_logs(home: str, log_dir: Path) -> ServerProcess:
    """``ep logs`` reading ``<home>/.eval_protocol/logs.db``, stopped by the caller (``.stop()``, by PID).

    Run as ``python -m eval_protocol logs`` so it is the interpreter the tests use. ``FIREWORKS_API_KEY`` must be
    set or the CLI dies while building its parser; any value works offline. ``--use-elasticsearch`` keeps the
    per-rollout "Logs" panel from calling the Fireworks tracing service (with no Elasticsearch configured it
    says so instead).
    """
    port = free_port()
    cmd = [sys.executable, "-m", "eval_protocol", "logs", "--port", str(port), "--use-elasticsearch"]
    env = {"HOME": home, "FIREWORKS_API_KEY": "offline-dummy", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    return start_server("ep-logs", cmd, port=port, log_dir=log_dir, host="localhost", env=env, timeout_s=120)


def table_url(server: ServerProcess, invocation_ids: Sequence[str], page_size: int = 50) -> str:
    """The table view filtered to these invocations (training runs), as the UI encodes filters in its URL."""
    group = {
        "logic": "OR",
        "filters": [
            {"field": "$.execution_metadata.invocation_id", "operator": "==", "value": i, "type": "text"}
            for i in invocation_ids
        ],
    }
    query = urllib.parse.urlencode(
        {"filterConfig": json.dumps([group]), "paginationConfig.pageSize": json.dumps(page_size)}
    )
    return f"{server.base_url}/table?{query}"


@contextmanager
def chromium_page(width: int = 1600, height: int = 1000) -> Iterator[tuple[Any, list[str]]]:
    """A playwright page in headless Debian Chromium, and the list its console errors are collected in."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            errors: list[str] = []
            page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
            yield page, errors
        finally:
            browser.close()


def wait_for_text(page: Any, texts: Sequence[str], timeout_s: float = 30.0) -> str:
    """Poll the page until every string is in its text; return the text.

    Polling the rendered text, not reloading, so rows that arrive over the websocket count only once drawn.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        body = page.inner_text("body")
        missing = [t for t in texts if t not in body]
        if not missing:
            return body
        if time.monotonic() > deadline:
            raise AssertionError(
                f"after {timeout_s:g} s the page still lacks {missing[:5]} "
                f"({len(missing)} of {len(texts)} missing); page text starts: {body[:1500]!r}"
            )
        time.sleep(0.25)


def row_text(page: Any, rollout_id: str) -> str:
    """The text of the table row of one rollout (its collapsed line)."""
    return page.locator("tbody tr", has_text=rollout_id).first.inner_text()


def wait_for_row(page: Any, rollout_id: str, status: str, timeout_s: float = 30.0) -> str:
    """The row's text once it shows ``status`` and no longer "running" (its final update has been drawn)."""
    deadline = time.monotonic() + timeout_s
    while True:
        text = row_text(page, rollout_id)
        if status in text and "running" not in text:
            return text
        if time.monotonic() > deadline:
            raise AssertionError(f"rollout {rollout_id} never showed {status!r}; its row reads {text!r}")
        time.sleep(0.25)
