"""Wire types of the BrowserGym MiniWoB++ environment (action, observation, state).

Every field holds plain JSON values (str, float, bool, lists, dicts) because the
server sends them over openenv's WebSocket as JSON: numpy values from BrowserGym
are converted before they reach these models.

openenv's ``serialize_observation`` drops ``Observation.metadata`` (and sends
``reward``/``done`` beside the observation), so anything a client should see
besides the named fields travels in ``info``.
"""

from typing import Any, Optional

from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field


class BrowserGymAction(Action):
    """One BrowserGym high-level action, e.g. ``click('13')`` or ``fill('12', 'abc')``.

    ``metadata`` (inherited) may carry how the action was obtained, e.g.
    ``{"fell_back": True, "parse_reason": "..."}`` from
    :func:`ep_trl.envs.browsergym.actions.browsergym_action_parser`; the server
    echoes it back in ``BrowserGymObservation.info["action_metadata"]``.
    """

    action_str: str = Field(..., description="A single BrowserGym action call, e.g. click('13')")


class BrowserGymObservation(Observation):
    """What the agent sees after ``reset`` or ``step``.

    ``reward``/``done``/``metadata`` are inherited from openenv's Observation.
    """

    goal: str = Field(default="", description="Task instruction (MiniWoB utterance)")
    url: str = Field(default="", description="URL of the active page")
    last_action: str = Field(default="", description="Action string the environment executed last")
    last_action_error: str = Field(default="", description="Error raised by the last action; empty if none")
    axtree_txt: str = Field(default="", description="Accessibility tree flattened to text, with [bid] markers")
    pruned_html: str = Field(default="", description="DOM flattened to HTML and pruned of scripts/styles")
    clickable_bids: list[str] = Field(default_factory=list, description="BrowserGym ids of clickable elements")
    screenshot: Optional[str] = Field(
        default=None, description="Viewport screenshot as base64 PNG; None unless screenshots were requested"
    )
    info: dict[str, Any] = Field(
        default_factory=dict,
        description="Task name, step, truncated flag, MiniWoB task info, echoed action metadata (JSON values)",
    )


class BrowserGymState(State):
    """Server-side episode bookkeeping (``episode_id``/``step_count`` are inherited)."""

    task_name: Optional[str] = Field(default=None, description="MiniWoB task of the current episode")
    seed: Optional[int] = Field(default=None, description="Seed the episode was reset with")
    goal: str = Field(default="", description="Task instruction")
    url: str = Field(default="", description="URL of the active page")
    cum_reward: float = Field(default=0.0, description="Sum of step rewards in this episode")
    done: bool = Field(default=False, description="Whether the episode has ended")
