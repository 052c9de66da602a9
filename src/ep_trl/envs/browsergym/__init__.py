"""BrowserGym MiniWoB++ as a local OpenEnv environment, plus its action parser and prompts.

Serve it with ``python -m ep_trl.envs.browsergym --port 8020`` (after ``scripts/install_browser.sh``) and talk to it
with ``BrowserGymEnv(base_url=...)``. Only light modules are imported here (models, parser, prompts, client): the
environment and server modules pull in BrowserGym and Playwright and are imported by the server process alone.

* ``client``: the async OpenEnv client (``.sync()`` for the blocking one);
* ``models``: the wire types (action, observation, state);
* ``actions``: free-form model output turned into exactly one BrowserGym action;
* ``prompts``: the prompt builder eval-protocol's processor calls;
* ``tasks``: the MiniWoB++ task catalogue;
* ``config``: the server's settings, from environment variables;
* ``observation``: BrowserGym's raw observation as a JSON-ready observation;
* ``runtime``: BrowserGym's browser runtime adapted to several sessions in one server;
* ``environment``: the environment, one Chromium per session;
* ``server``: the ASGI app on openenv's stock server.
"""

from ep_trl.envs.browsergym.actions import (
    ACTION_ALIASES,
    ACTION_SPECS,
    FALLBACK_ACTION,
    ParsedAction,
    browsergym_action_parser,
    parse_action,
)
from ep_trl.envs.browsergym.client import BrowserGymEnv
from ep_trl.envs.browsergym.models import BrowserGymAction, BrowserGymObservation, BrowserGymState
from ep_trl.envs.browsergym.prompts import (
    SYSTEM_PROMPT,
    build_prompt,
    build_prompt_parts,
    build_user_content,
)

__all__ = [
    "ACTION_ALIASES",
    "ACTION_SPECS",
    "FALLBACK_ACTION",
    "SYSTEM_PROMPT",
    "BrowserGymAction",
    "BrowserGymEnv",
    "BrowserGymObservation",
    "BrowserGymState",
    "ParsedAction",
    "browsergym_action_parser",
    "build_prompt",
    "build_prompt_parts",
    "build_user_content",
    "parse_action",
]
