"""Reading a door out of a model's reply, shared by the doors eval (its action parser) and the training script (which
counts the replies that named no door)."""

import re

from ep_trl.envs.doors.environment import COLOURS

_COLOUR = re.compile(r"\b(" + "|".join(COLOURS) + r")\b", re.IGNORECASE)


def parse_door(text: str) -> str | None:
    """The first door colour ``text`` names, lower case; None when it names none."""
    match = _COLOUR.search(text or "")
    return match.group(1).lower() if match else None
