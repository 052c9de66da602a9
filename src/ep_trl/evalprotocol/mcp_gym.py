"""MCP-gym episodes start on their row's seed.

eval-protocol's MCP-gym servers (``McpGym``, e.g. its FrozenLake server) create a session's environment without a
seed, whatever the row's ``environment_context["seed"]``: the first contact (``/control/initial_state`` or a tool
call) makes an unseeded one, and only ``/control/reset_session`` builds the seeded one, which
``MCPGymRolloutProcessor`` calls after a rollout (as clean-up) and never before. Under eval-protocol's own runs a
session keeps its id across runs (a hash of the row and the model name), so every run after the first plays the
row's environment. Under ep_trl every episode routes its calls by a model name of its own, so its session is always
new, and without this every episode would play an unseeded environment: a random lake, not its row's, the same for
no two episodes of a group and never the held-out row's.

So, while ep_trl runs an MCP-gym eval, the processor's client (``MCPConnectionManager.get_initial_state``, the one
call it makes before the first move) first lets the server create the session, then resets it with the row's seed
through eval-protocol's own ``reset_session``, then reads the initial state: the episode plays the row's
environment from its first move. Rows without a seed are left as they are. The change is made for as long as an
MCP-gym eval's processor is set up (``processors.setup`` to ``processors.cleanup``, counted) and undone after.
``tests/evalprotocol/test_mcp_gym.py`` pins both halves against the installed eval-protocol and its FrozenLake server:
that its server alone ignores the seed of a new session (when that stops being true, this module can go) and that
under ep_trl every episode plays its row's lake.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable, Iterable
from typing import Protocol

from ..trajectory.types import Row
from ._private import private_name


class _Session(Protocol):
    """What ep_trl reads of eval-protocol's ``MCPSession``."""

    seed: int | None


class _Manager(Protocol):
    """What ep_trl calls of eval-protocol's ``MCPConnectionManager``."""

    def reset_session(self, session: _Session) -> Awaitable[None]: ...


_InitialState = Callable[[_Manager, _Session], Awaitable[object]]

#: The processor whose sessions this applies to, told by class name (eval-protocol is imported only where it is used).
PROCESSOR = "MCPGymRolloutProcessor"


def is_mcp_gym(processor: object) -> bool:
    """Whether ``processor`` is eval-protocol's ``MCPGymRolloutProcessor``."""
    return type(processor).__name__ == PROCESSOR


_lock = threading.Lock()
_users = 0
_original: _InitialState | None = None


def _manager_class() -> type:
    """eval-protocol's ``MCPConnectionManager``, through the guarded door (its package does not export it)."""
    manager: type = private_name("eval_protocol.mcp.client.connection", "MCPConnectionManager")
    return manager


def _seeded(original: _InitialState) -> _InitialState:
    async def get_initial_state(self: _Manager, session: _Session) -> object:
        if session.seed is not None:
            await original(self, session)  # the server creates the session (without the seed)
            await self.reset_session(session)  # eval-protocol's reset: the environment of the row's seed
        return await original(self, session)

    get_initial_state.__doc__ = (
        f"{original.__doc__ or ''}\n\n(ep_trl: a session with a seed is reset with it "
        "first: ep_trl.evalprotocol.mcp_gym)"
    )
    setattr(get_initial_state, "ep_trl_seeded", True)
    return get_initial_state


def start_seeded_sessions() -> None:
    """From now until the matching :func:`stop_seeded_sessions`, MCP-gym sessions start on their row's seed."""
    global _users, _original
    with _lock:
        _users += 1
        if _users == 1:
            manager = _manager_class()
            _original = manager.get_initial_state  # type: ignore[attr-defined]
            assert _original is not None
            setattr(manager, "get_initial_state", _seeded(_original))


def stop_seeded_sessions() -> None:
    """Undo one :func:`start_seeded_sessions`; the last one puts eval-protocol's method back."""
    global _users, _original
    with _lock:
        if _users == 0:
            raise AssertionError("stop_seeded_sessions() without start_seeded_sessions()")
        _users -= 1
        if _users == 0:
            assert _original is not None
            setattr(_manager_class(), "get_initial_state", _original)
            _original = None


def seeded_sessions_on() -> bool:
    """Whether MCP-gym sessions start on their row's seed now."""
    return bool(getattr(getattr(_manager_class(), "get_initial_state"), "ep_trl_seeded", False))


def seed_zero_rows(rows: Iterable[Row]) -> list[str]:
    """The row ids of ``rows`` whose environment seed is 0. eval-protocol's MCP-gym server builds a seeded environment
    only for a true seed (``if seed:`` in ``McpGym._new_env``), so seed 0 means no seed there: such a row plays a
    random environment in every episode, with or without this module."""
    found = []
    for row in rows:
        info = row.input_metadata.dataset_info or {}
        context = info.get("environment_context") or {}
        if isinstance(context, dict) and context.get("seed") == 0 and not isinstance(context.get("seed"), bool):
            found.append(str(row.input_metadata.row_id))
    return found
