"""The doors game: a seeded multi-turn OpenEnv text environment whose rooms must be read to leave them
(``environment.py`` says how it plays).

Serve it with ``python -m ep_trl.envs.doors --port 8012`` and talk to it with ``DoorsEnv(base_url=...)`` (async)
or ``DoorsEnv(...).sync()``. The server module is not imported here so clients do not pull in FastAPI apps.
"""

from ep_trl.envs.doors.actions import parse_door
from ep_trl.envs.doors.client import DoorsEnv
from ep_trl.envs.doors.environment import (COLOURS, HELD_OUT_WORDINGS, LOCKED_ONLY_WORDINGS, TRAINING_WORDINGS,
                                           WORDINGS, DoorsEnvironment, Room, house, sign)
from ep_trl.envs.doors.models import DoorsAction, DoorsObservation, DoorsState

__all__ = ["COLOURS", "HELD_OUT_WORDINGS", "LOCKED_ONLY_WORDINGS", "TRAINING_WORDINGS", "WORDINGS", "DoorsAction",
           "DoorsEnv", "DoorsEnvironment", "DoorsObservation", "DoorsState", "Room", "house", "parse_door", "sign"]
