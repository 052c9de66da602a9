"""Settings of the BrowserGym server, read from environment variables.

The server is started as a separate process (``python -m ep_trl.envs.browsergym``),
so environment variables are how callers configure what every session does;
per-episode choices (task, seed, screenshot) are ``reset`` arguments instead.
"""

import os
from dataclasses import dataclass
from typing import Optional

SCREENSHOT_ENV_VAR = "BROWSERGYM_SCREENSHOT"
PRE_OBSERVATION_DELAY_ENV_VAR = "BROWSERGYM_PRE_OBSERVATION_DELAY"
TIMEOUT_MS_ENV_VAR = "BROWSERGYM_TIMEOUT_MS"
ACTION_SUBSETS_ENV_VAR = "BROWSERGYM_ACTION_SUBSETS"
MAX_SESSIONS_ENV_VAR = "BROWSERGYM_MAX_SESSIONS"
SESSION_TIMEOUT_ENV_VAR = "BROWSERGYM_SESSION_TIMEOUT_S"

#: Two browsers is the useful maximum on a 2-core machine (each step keeps a core busy).
DEFAULT_MAX_SESSIONS = 2
#: BrowserGym waits this long after an action before reading the page (its default is 0.5 s);
#: MiniWoB's own 100 ms slow-motion per Playwright call already lets events settle.
DEFAULT_PRE_OBSERVATION_DELAY_S = 0.0
#: Element actions, coordinate actions, and messages/infeasibility reports. Navigation and tab
#: actions are left out: leaving the task page ends a MiniWoB episode with reward 0.
DEFAULT_ACTION_SUBSETS: tuple[str, ...] = ("bid", "coord", "chat", "infeas")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


@dataclass(frozen=True)
class BrowserGymConfig:
    """How every environment instance of the server runs its browser."""

    screenshot: bool = False
    pre_observation_delay_s: float = DEFAULT_PRE_OBSERVATION_DELAY_S
    timeout_ms: Optional[int] = None  # None keeps the task's own Playwright timeout (MiniWoB: 5000 ms)
    action_subsets: tuple[str, ...] = DEFAULT_ACTION_SUBSETS
    headless: bool = True

    @classmethod
    def from_env(cls) -> "BrowserGymConfig":
        """Read the ``BROWSERGYM_*`` variables; unset ones keep the defaults."""
        subsets_text = os.environ.get(ACTION_SUBSETS_ENV_VAR, "").strip()
        subsets = tuple(s.strip() for s in subsets_text.split(",") if s.strip()) or DEFAULT_ACTION_SUBSETS
        timeout = _env_number(TIMEOUT_MS_ENV_VAR)
        return cls(
            screenshot=env_flag(SCREENSHOT_ENV_VAR, False),
            pre_observation_delay_s=_env_float(PRE_OBSERVATION_DELAY_ENV_VAR, DEFAULT_PRE_OBSERVATION_DELAY_S),
            timeout_ms=None if timeout is None else int(timeout),
            action_subsets=subsets,
        )


def max_sessions_from_env() -> int:
    """``BROWSERGYM_MAX_SESSIONS`` (default 2): concurrent sessions, i.e. browsers."""
    value = int(_env_float(MAX_SESSIONS_ENV_VAR, DEFAULT_MAX_SESSIONS))
    if value < 1:
        raise ValueError(f"{MAX_SESSIONS_ENV_VAR} must be at least 1, got {value}.")
    return value


def session_timeout_from_env() -> Optional[float]:
    """``BROWSERGYM_SESSION_TIMEOUT_S``: close sessions idle this long (unset: never)."""
    value = _env_number(SESSION_TIMEOUT_ENV_VAR)
    if value is not None and value <= 0:
        raise ValueError(f"{SESSION_TIMEOUT_ENV_VAR} must be positive, got {value}.")
    return value


def env_flag(name: str, default: bool) -> bool:
    """Boolean environment variable ('1/true/yes/on' or '0/false/no/off')."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    text = raw.strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"{name}={raw!r} is not a boolean; use 1/0, true/false, yes/no or on/off.")


def _env_float(name: str, default: float) -> float:
    """Numeric environment variable, or ``default`` when unset or empty."""
    value = _env_number(name)
    return default if value is None else value


def _env_number(name: str) -> Optional[float]:
    """Numeric environment variable, or None when unset or empty."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number.") from None
