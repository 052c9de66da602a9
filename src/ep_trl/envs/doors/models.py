"""Wire types of the doors game (shared by server and client), on openenv's pydantic ``Action``/``Observation``/
``State`` so the stock server validates actions and serializes observations (it sends reward and done beside the
observation; the client puts them back)."""

from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field


class DoorsAction(Action):
    """One move: the colour of the door the player tries (lower case; empty when the reply named no door)."""

    door: str = Field(default="", description="Colour of the door tried, e.g. 'blue'; '' when none was named")


class DoorsObservation(Observation):
    """What the player sees: ``text`` is the room as the model reads it; the other fields let prompt builders and
    tests read the game without parsing it."""

    text: str = Field(description="The room, its doors, its sign and what the last move did")
    room: int = Field(ge=1, description="Room the player is in (1-based); rooms + 1 once out")
    rooms: int = Field(ge=1, description="Rooms in the house")
    doors: list[str] = Field(default_factory=list, description="Door colours of the current room, in order")
    moves: int = Field(ge=0, description="Moves made so far")
    max_moves: int = Field(ge=1, description="Moves allowed")
    escaped: bool = Field(default=False, description="Whether the player left the last room")
    seed: int | None = Field(default=None, description="Reset seed the house was drawn from (which house this is)")
    wording: str | None = Field(
        default=None,
        description="The signs' wording named at reset (a name in "
        "ep_trl.envs.doors.WORDINGS); None: the training wordings, drawn per room",
    )


class DoorsState(State):
    """Server-side episode state (``episode_id`` and ``step_count`` inherited)."""

    seed: int | None = Field(default=None, description="Seed the house was drawn from")
    wording: str | None = Field(default=None, description="The signs' wording named at reset; None: training's")
    room: int = Field(default=1, description="Current room (1-based)")
    moves: list[str] = Field(default_factory=list, description="Doors tried, in order")
    escaped: bool = Field(default=False)
    done: bool = Field(default=False)
