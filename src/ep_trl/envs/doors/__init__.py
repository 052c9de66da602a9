"""The doors game: a seeded multi-turn OpenEnv text environment whose rooms must be read to leave them.

Serve it with ``python -m ep_trl.envs.doors --port 8012`` and talk to it with ``DoorsEnv(base_url=...)`` (async)
or ``DoorsEnv(...).sync()``. The server module is not imported here so clients do not pull in FastAPI apps.

* ``environment``: the game (how a house is drawn and played);
* ``models``: the wire types;
* ``actions``: reading a door out of a model's reply;
* ``client``: the async OpenEnv client;
* ``server``: the ASGI app on openenv's stock server.
"""

from ep_trl.envs.doors.actions import parse_door
from ep_trl.envs.doors.client import DoorsEnv
from ep_trl.envs.doors.environment import (
    COLOURS,
    HELD_OUT_WORDINGS,
    LOCKED_ONLY_WORDINGS,
    TRAINING_WORDINGS,
    WORDINGS,
    DoorsEnvironment,
    Room,
    house,
    sign,
)
from ep_trl.envs.doors.models import DoorsAction, DoorsObservation, DoorsState

__all__ = [
    "COLOURS",
    "HELD_OUT_WORDINGS",
    "LOCKED_ONLY_WORDINGS",
    "TRAINING_WORDINGS",
    "WORDINGS",
    "DoorsAction",
    "DoorsEnv",
    "DoorsEnvironment",
    "DoorsObservation",
    "DoorsState",
    "Room",
    "house",
    "parse_door",
    "sign",
]
