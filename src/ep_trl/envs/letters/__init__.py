"""The letters game: a deterministic multi-turn OpenEnv text environment.

Serve it with ``python -m ep_trl.envs.letters --port 8011`` and talk to it with ``LettersEnv(base_url=...)`` (async)
or ``LettersEnv(...).sync()``. The server module is not imported here so clients do not pull in FastAPI apps.

* ``environment``: the game;
* ``models``: the wire types;
* ``episode_log``: the server's record of every episode, for tests to compare with what the model sampled;
* ``client``: the async OpenEnv client;
* ``server``: the ASGI app on openenv's stock server.
"""

from ep_trl.envs.letters.client import LettersEnv
from ep_trl.envs.letters.environment import (
    CRASH_MESSAGE,
    MAX_STEPS_ENV_VAR,
    STEP_LATENCY_ENV_VAR,
    TASK_ENV_VAR,
    TASKS,
    LettersEnvironment,
    score_text,
)
from ep_trl.envs.letters.models import LettersAction, LettersObservation, LettersState

__all__ = [
    "CRASH_MESSAGE",
    "MAX_STEPS_ENV_VAR",
    "STEP_LATENCY_ENV_VAR",
    "TASK_ENV_VAR",
    "TASKS",
    "LettersAction",
    "LettersEnv",
    "LettersEnvironment",
    "LettersObservation",
    "LettersState",
    "score_text",
]
