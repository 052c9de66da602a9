"""The doors game: a seeded multi-turn text environment in which the observation must be read to act right.

A house (drawn from the reset's ``seed``) has ``rooms`` rooms of four coloured doors each; one door of each room
opens. Each room's sign says which, in a wording (:data:`WORDINGS`). Training plays the two
:data:`TRAINING_WORDINGS`, drawn per room from the seed: "The blue door is open; the others are locked." or "Every
door is locked except the blue one." A reset that names a ``wording`` puts every room's sign in that one: the
:data:`HELD_OUT_WORDINGS` are for held-out play only (``ep_trl.devtools.doors_houses``), and two of them name only the
locked doors, so the player must find the open one as the door the sign leaves out. Each move tries one door: the
open one leads to the next room, a locked one stays shut (the next observation says so), and the player has
``max_moves`` moves in all. The episode's reward is 1 when the player leaves the last room, else 0: a player that
reads each room leaves in ``rooms`` moves; one that guesses usually runs out.

Each observation reports the house's ``seed`` and the reset's ``wording`` (None: the training wordings, drawn per
room), so an episode's row can say which house it played.
"""

import random
from dataclasses import dataclass
from typing import Any, Optional

from openenv.core.env_server.interfaces import Environment

from ep_trl.envs.doors.models import DoorsAction, DoorsObservation, DoorsState

#: Door colours; a room shows four of them.
COLOURS: tuple[str, ...] = ("red", "blue", "green", "yellow", "white", "black", "orange", "purple")
DOORS_PER_ROOM = 4
DEFAULT_ROOMS = 2
DEFAULT_MAX_MOVES = 4

#: Sign wordings by name: ``{open}`` is the open door, ``{locked}`` the three locked ones in the room's order
#: ("red, green and white"), ``{locked_or}`` the same joined with "or".
WORDINGS: dict[str, str] = {
    "is-open": "The {open} door is open; the others are locked.",
    "except": "Every door is locked except the {open} one.",
    "only": "Only the {open} door opens.",
    "opens-but-not": "The {open} door opens, but the {locked} doors do not.",
    "locked": "The {locked} doors are locked.",
    "do-not-try": "Do not try the {locked_or} door: each of them is locked.",
}
#: The wordings training shows, each room's drawn from the house's seed.
TRAINING_WORDINGS: tuple[str, ...] = ("is-open", "except")
#: Wordings training never shows, played only on held-out houses.
HELD_OUT_WORDINGS: tuple[str, ...] = ("only", "opens-but-not", "locked", "do-not-try")
#: Held-out wordings whose sign names only the locked doors, never the open one.
LOCKED_ONLY_WORDINGS: tuple[str, ...] = ("locked", "do-not-try")


@dataclass(frozen=True)
class Room:
    """One room: its doors in order, the one that opens, and its sign."""

    doors: tuple[str, ...]
    open_door: str
    sign: str


def sign(wording: str, doors: tuple[str, ...], open_door: str) -> str:
    """The sign of a room with ``doors`` whose ``open_door`` opens, in ``wording`` (a name in :data:`WORDINGS`)."""
    if wording not in WORDINGS:
        raise ValueError(f"doors: no sign wording {wording!r}; the wordings are {', '.join(WORDINGS)}")
    locked = [d for d in doors if d != open_door]
    return WORDINGS[wording].format(
        open=open_door,
        locked=f"{', '.join(locked[:-1])} and {locked[-1]}",
        locked_or=f"{', '.join(locked[:-1])} or {locked[-1]}",
    )


def house(seed: int, rooms: int = DEFAULT_ROOMS, wording: Optional[str] = None) -> tuple[Room, ...]:
    """The rooms of the house drawn from ``seed`` (the same seed, the same house): each room's sign in one of the
    :data:`TRAINING_WORDINGS` drawn from the seed, or, given ``wording``, every sign in that one (the same doors and
    open doors either way)."""
    if wording is not None and wording not in WORDINGS:
        raise ValueError(f"doors: no sign wording {wording!r}; the wordings are {', '.join(WORDINGS)}")
    rng = random.Random(f"ep_trl doors house {seed}")
    drawn = []
    for _ in range(rooms):
        doors = tuple(rng.sample(COLOURS, DOORS_PER_ROOM))
        open_door = rng.choice(doors)
        drawn_wording = TRAINING_WORDINGS[0] if rng.random() < 0.5 else TRAINING_WORDINGS[1]
        drawn.append(Room(doors=doors, open_door=open_door, sign=sign(wording or drawn_wording, doors, open_door)))
    return tuple(drawn)


class DoorsEnvironment(Environment[DoorsAction, DoorsObservation, DoorsState]):
    """One doors session (the stock openenv server makes one per WebSocket session)."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = DoorsState()
        self._house: tuple[Room, ...] = ()
        self._max_moves = DEFAULT_MAX_MOVES

    def reset(
        self,
        seed: Optional[int] = None,
        episode_id: Optional[str] = None,
        rooms: Optional[int] = None,
        max_moves: Optional[int] = None,
        wording: Optional[str] = None,
        **kwargs: Any,
    ) -> DoorsObservation:
        """Draw the house from ``seed`` (a random one when None), its signs in ``wording`` (None: the training
        wordings, drawn per room), and stand in its first room."""
        if seed is None:
            seed = random.randrange(2**31)
        rooms = DEFAULT_ROOMS if rooms is None else int(rooms)
        self._max_moves = DEFAULT_MAX_MOVES if max_moves is None else int(max_moves)
        if rooms < 1 or self._max_moves < rooms:
            raise ValueError(
                f"doors: rooms={rooms}, max_moves={self._max_moves}: need rooms >= 1 and max_moves >= "
                "rooms (a player that reads every room needs one move per room)"
            )
        self._house = house(int(seed), rooms, wording)
        self._state = DoorsState(episode_id=episode_id, step_count=0, seed=int(seed), wording=wording)
        return self._observation(message="", reward=None)

    def step(self, action: DoorsAction, timeout_s: Optional[float] = None, **kwargs: Any) -> DoorsObservation:
        """Try ``action.door`` in the current room."""
        st = self._state
        if not self._house:
            raise RuntimeError("doors: step() called before reset()")
        if st.done:
            raise RuntimeError(f"doors: episode {st.episode_id} is over; call reset()")
        room = self._house[st.room - 1]
        door = action.door.strip().lower()
        st.step_count += 1
        st.moves = [*st.moves, door]
        if door == room.open_door:
            message = f"You went through the {door} door."
            st.room += 1
            st.escaped = st.room > len(self._house)
        elif door in room.doors:
            message = f"The {door} door is locked."
        elif door:
            message = f"There is no {door} door in this room."
        else:
            message = "You did not name a door."
        st.done = st.escaped or st.step_count >= self._max_moves
        if st.done and not st.escaped:
            message += " You are out of moves."
        return self._observation(message=message, reward=1.0 if st.escaped else 0.0)

    @property
    def state(self) -> DoorsState:
        return self._state

    def _observation(self, *, message: str, reward: float | None) -> DoorsObservation:
        st = self._state
        rooms = len(self._house)
        if st.escaped:
            text = f"{message} You left the house."
            doors: list[str] = []
        else:
            room = self._house[st.room - 1]
            doors = list(room.doors)
            lead = f"{message} " if message else ""
            text = (
                f"{lead}Room {st.room} of {rooms}. Doors: {', '.join(room.doors)}. {room.sign} "
                f"Moves left: {self._max_moves - st.step_count}. Which door do you take?"
            )
        return DoorsObservation(
            text=text,
            room=st.room,
            rooms=rooms,
            doors=doors,
            moves=st.step_count,
            max_moves=self._max_moves,
            escaped=st.escaped,
            seed=st.seed,
            wording=st.wording,
            metadata={"seed": st.seed, "wording": st.wording},
            done=st.done,
            reward=reward,
        )
