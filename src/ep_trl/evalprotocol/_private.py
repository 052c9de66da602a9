"""The one guarded door to eval-protocol names that are not its public API.

ep_trl reads the ``OpenEnvRolloutProcessor``'s settings (kept in private attributes), the eval wrapper's
``_origin_func``, a few internal modules of eval-protocol's log store, and the servers ``MCPServerManager`` runs. Every
such name is listed here and read through :func:`private_attr` or :func:`private_name`, so a rename in a new
eval-protocol release fails at construction with a message naming the name, the installed version and the supported
range, and ``tests/evalprotocol/test_private.py`` walks these lists against the installed eval-protocol.
"""

import importlib
from typing import Any

from ..errors import UnsupportedEvalError
from ..runtime.versions import installed_version, require_supported, show, supported_range

#: Private attributes of ``OpenEnvRolloutProcessor`` that hold the eval's environment settings.
PROCESSOR_ATTRIBUTES = (
    "_provided_env_factory",
    "_env_client_cls",
    "_env_base_url",
    "_request_timeout_s",
    "_default_headers",
    "_tasks",
    "_task_var",
    "_env_vars",
    "_docker_image",
    "_hub_repo_id",
)

#: The attribute of an ``@evaluation_test`` wrapper that holds the undecorated body.
BODY_ATTRIBUTE = "_origin_func"

#: The class attribute of ``MCPServerManager`` that lists every server manager not stopped yet.
SERVER_MANAGERS_ATTRIBUTE = "_active_servers"

#: The method of ``MCPServerManager`` that waits for its server to take connections (``mcp_servers`` bounds it).
SERVER_READY_METHOD = "_wait_for_server_ready"

#: Names in eval-protocol modules that its package does not export.
MODULE_NAMES = (
    ("eval_protocol.pytest.openenv_rollout_processor", "OpenEnvRolloutProcessor"),
    ("eval_protocol.dataset_logger.sqlite_evaluation_row_store", "SqliteEvaluationRowStore"),
    ("eval_protocol.event_bus.sqlite_event_bus_database", "SqliteEventBusDatabase"),
    ("eval_protocol.dataset_logger.dataset_logger", "LOG_EVENT_TYPE"),
    ("eval_protocol.pytest.generate_parameter_combinations", "generate_parameter_combinations"),
    ("eval_protocol.pytest.default_mcp_gym_rollout_processor", "MCPServerManager"),
    ("eval_protocol.mcp.client.connection", "MCPConnectionManager"),
)


def check_version() -> None:
    """Raise ``VersionError`` unless the installed eval-protocol is in ep_trl's declared range."""
    require_supported("eval-protocol")


def _unsupported(what: str) -> UnsupportedEvalError:
    return UnsupportedEvalError(
        f"{what} in eval-protocol {installed_version('eval-protocol')}; ep_trl reads it to reuse the eval's settings "
        f"and supports eval-protocol {show(supported_range('eval-protocol'))}. Install a supported eval-protocol."
    )


def private_attr(obj: object, name: str) -> Any:
    """``obj.name`` for a listed private attribute; a clear error when this eval-protocol lacks it."""
    if name not in PROCESSOR_ATTRIBUTES + (BODY_ATTRIBUTE, SERVER_MANAGERS_ATTRIBUTE, SERVER_READY_METHOD):
        raise AssertionError(f"{name!r} is not listed in ep_trl.evalprotocol._private; list it before reading it")
    if not hasattr(obj, name):
        raise _unsupported(f"{type(obj).__name__} has no attribute {name!r}")
    return getattr(obj, name)


def private_name(module: str, name: str) -> Any:
    """``module.name`` for a listed internal name; a clear error when this eval-protocol lacks it."""
    if (module, name) not in MODULE_NAMES:
        raise AssertionError(f"{module}.{name} is not listed in ep_trl.evalprotocol._private; list it first")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise _unsupported(f"{module}.{name} cannot be imported ({type(exc).__name__}: {exc})") from exc
