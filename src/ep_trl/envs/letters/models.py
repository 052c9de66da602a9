"""Wire types of the letters game (shared by server and client).

They subclass openenv-core's pydantic ``Action``/``Observation``/``State`` so
the stock server can validate actions and serialize observations. Note that
openenv's serializer strips ``reward``, ``done`` and ``metadata`` from the
observation dict and sends reward/done beside it; the client puts them back.
"""

from typing import Optional

from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field


class LettersAction(Action):
    """One move: the text the model wrote, used byte-for-byte by the server."""

    text: str = Field(description="The text written by the player (scored character by character)")


class LettersObservation(Observation):
    """What the player sees after reset or after a step.

    ``prompt`` is the text meant for the model; the other fields let tests and
    prompt builders read the game state without parsing it.
    """

    task_name: str = Field(description="Task being played, e.g. 'vowels'")
    step: int = Field(ge=0, description="Number of steps taken so far in this episode")
    max_steps: int = Field(ge=1, description="Episode length in steps")
    alphabet: str = Field(description="Characters that score for this task")
    prompt: str = Field(description="Instruction for the next move (echoes the last action)")
    last_action: Optional[str] = Field(default=None, description="Text of the previous action, if any")


class LettersState(State):
    """Server-side episode state (``episode_id`` and ``step_count`` inherited)."""

    task_name: Optional[str] = Field(default=None, description="Task of the current episode")
    max_steps: int = Field(default=0, ge=0, description="Episode length in steps (0 before reset)")
    alphabet: str = Field(default="", description="Characters that score for this task")
    actions: list[str] = Field(default_factory=list, description="Action texts received this episode")
    rewards: list[float] = Field(default_factory=list, description="Rewards given this episode")
    done: bool = Field(default=False, description="Whether the episode has ended")
