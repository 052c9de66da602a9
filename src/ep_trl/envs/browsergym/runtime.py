"""Adapt BrowserGym's browser runtime to a server with several sessions at once.

BrowserGym (0.14) assumes one environment per process:

* it keeps ONE process-wide Playwright instance (``browsergym.core._get_global_playwright``).
  Playwright's sync API is bound to the thread that started it, so a second
  session running on another thread fails with greenlet "cannot switch to a
  different thread" errors. Playwright's documented answer is one instance per
  thread, which :func:`thread_playwright` provides;
* every ``reset`` launches a second Chromium just to render a chat window
  (``browsergym.core.chat.Chat``) that MiniWoB never shows to the agent. An
  in-memory chat keeps the message list BrowserGym reads and saves one browser
  (about 1 s per reset and ~165 MB per session, measured on 2 cores).

:func:`install_browsergym_patches` swaps both in (idempotent). They affect every
BrowserGym environment in this process, which is why only the server process of
``ep_trl.envs.browsergym`` installs them.
"""

import logging
import threading
import time
from typing import Any, Literal, Optional

logger = logging.getLogger(__name__)

_INSTALL_HINT = "run scripts/install_browser.sh"
_local = threading.local()
_patch_lock = threading.Lock()
_patched = False


def thread_playwright() -> Any:
    """This thread's Playwright instance, started on first use.

    Drop-in replacement for ``browsergym.core._get_global_playwright``.
    """
    playwright = getattr(_local, "playwright", None)
    if playwright is None:
        from playwright.sync_api import sync_playwright

        started = time.monotonic()
        playwright = sync_playwright().start()
        _local.playwright = playwright
        elapsed = time.monotonic() - started
        logger.debug("Started Playwright for thread %s in %.2f s", threading.current_thread().name, elapsed)
    return playwright


def stop_thread_playwright() -> None:
    """Stop this thread's Playwright instance (its driver process) if one was started."""
    playwright = getattr(_local, "playwright", None)
    if playwright is None:
        return
    _local.playwright = None
    playwright.stop()
    logger.debug("Stopped Playwright for thread %s", threading.current_thread().name)


class InMemoryChat:
    """BrowserGym ``Chat`` without a browser: keeps the message list the environment reads.

    Same constructor and methods as ``browsergym.core.chat.Chat`` as far as
    ``BrowserEnv`` uses them (video recording is not supported).
    """

    _ROLES = ("user", "user_image", "assistant", "info", "infeasible")

    def __init__(
        self,
        headless: bool,
        chat_size: tuple[int, int] = (500, 800),
        record_video_dir: Optional[str] = None,
        modern: bool = True,
    ) -> None:
        """Accept Chat's arguments; recording a chat video needs the real Chat."""
        if record_video_dir:
            raise ValueError("InMemoryChat cannot record chat videos; do not set record_video_dir.")
        self.messages: list[dict[str, Any]] = []
        self.recording_start_time = None

    def add_message(self, role: Literal["user", "user_image", "assistant", "info", "infeasible"], msg: str) -> None:
        """Record a message as Chat does ('info' messages are display-only and not kept)."""
        if role not in self._ROLES:
            raise ValueError(f"Invalid role: {role}")
        if role != "info":
            self.messages.append({"role": role, "timestamp": time.time(), "message": msg})

    def wait_for_user_message(self) -> None:
        """There is no human at this chat: waiting would block the session forever."""
        raise RuntimeError("InMemoryChat has no user to wait for; create BrowserEnv with wait_for_user_message=False.")

    def close(self) -> None:
        """Nothing to release."""


def install_browsergym_patches() -> None:
    """Make BrowserGym use one Playwright per thread and a browserless chat (once per process)."""
    global _patched
    with _patch_lock:
        if _patched:
            return
        import browsergym.core
        import browsergym.core.chat
        import browsergym.core.env

        for module in (browsergym.core, browsergym.core.env, browsergym.core.chat):
            if not hasattr(module, "_get_global_playwright"):
                raise RuntimeError(
                    f"{module.__name__} has no _get_global_playwright: this BrowserGym version is not supported "
                    f"(expected browsergym-core 0.14.x); {_INSTALL_HINT}."
                )
            module._get_global_playwright = thread_playwright
        if not hasattr(browsergym.core.env, "Chat"):
            raise RuntimeError(f"browsergym.core.env has no Chat: unsupported BrowserGym version; {_INSTALL_HINT}.")
        browsergym.core.env.Chat = InMemoryChat
        _patched = True
        logger.debug("Installed per-thread Playwright and in-memory chat into BrowserGym")


def check_browser_installed() -> str:
    """Return the Chromium path Playwright will launch; raise with a fix if it is missing.

    Run before serving so a missing browser is reported at start-up, not as a
    failed ``reset`` (Playwright's own message suggests a download that cannot
    work offline).
    """
    from pathlib import Path

    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        raise RuntimeError(f"playwright is not installed ({exc}): {_INSTALL_HINT}.") from exc
    with sync_playwright() as playwright:
        executable = playwright.chromium.executable_path
    if not Path(executable).exists():
        raise RuntimeError(f"Playwright's Chromium is missing at {executable}: {_INSTALL_HINT}.")
    return executable
