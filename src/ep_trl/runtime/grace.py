"""The stop grace: how long a SIGTERM'd training process may take to end by itself before ep_trl ends it
(docs/failures.md). :func:`ep_trl.runtime.shutdown.current_grace_s` gives the one in force."""

import math
import os

from ..errors import ConfigError

#: The stop grace when neither ``RolloutOptions(stop_grace_s=...)`` nor ``EP_TRL_STOP_GRACE_S`` sets one: seconds
#: from the first SIGTERM until ep_trl ends a process that has not ended by itself. Kubernetes
#: (``terminationGracePeriodSeconds``) and Slurm (``KillWait``) send SIGKILL 30 s after SIGTERM by default; the rest
#: is left to the interpreter's own teardown (about 2 s for a torch process, which no thread can cut short).
DEFAULT_STOP_GRACE_S = 25.0
#: The environment variable that sets the stop grace (seconds) for rollout functions whose options do not.
GRACE_ENV = "EP_TRL_STOP_GRACE_S"


def env_grace_s() -> float:
    """``EP_TRL_STOP_GRACE_S``'s grace, else :data:`DEFAULT_STOP_GRACE_S`. Raises ``ConfigError`` for a bad value."""
    raw = os.environ.get(GRACE_ENV, "").strip()
    if not raw:
        return DEFAULT_STOP_GRACE_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(
            f"{GRACE_ENV}={raw!r}: the stop grace must be a finite number of seconds > 0, e.g. "
            f"{GRACE_ENV}=25: how long a process may take to end by itself after SIGTERM (keep it "
            "below your scheduler's wait before SIGKILL, 30 s for Kubernetes and Slurm)."
        )
    return value
