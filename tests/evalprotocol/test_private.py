"""Every eval-protocol name that is not public API, as ep_trl reads it: pinned against the installed release."""

import importlib
from typing import Any

import pytest
from eval_protocol.pytest.openenv_rollout_processor import OpenEnvRolloutProcessor

from ep_trl import UnsupportedEvalError
from ep_trl.evalprotocol import _private, read_eval_spec, resolve_eval_test
from ep_trl.evalprotocol._private import BODY_ATTRIBUTE, MODULE_NAMES, PROCESSOR_ATTRIBUTES, private_attr, private_name
from tests.evals import letters_parts as parts


def test_processor_still_has_the_private_attributes_we_read() -> None:
    processor = OpenEnvRolloutProcessor(
        env_factory=parts.make_env_factory(),
        action_parser=parts.action_parser,
        tasks=["vowels"],
        task_var="X",
        request_timeout_s=7.0,
    )
    missing = [name for name in PROCESSOR_ATTRIBUTES if not hasattr(processor, name)]
    assert not missing, f"eval-protocol renamed {missing}; update ep_trl/evalprotocol/spec.py"
    wrapper = resolve_eval_test("tests.evals.eval_letters").wrapper
    assert callable(getattr(wrapper, BODY_ATTRIBUTE)) and wrapper.__ep_params__.steps == parts.STEPS


@pytest.mark.parametrize(("module", "name"), MODULE_NAMES)
def test_internal_module_names_we_read_still_exist(module: str, name: str) -> None:
    assert hasattr(importlib.import_module(module), name), f"eval-protocol moved {module}.{name}"
    assert private_name(module, name) is getattr(importlib.import_module(module), name)


def test_only_listed_names_go_through_the_door() -> None:
    with pytest.raises(AssertionError, match="not listed"):
        private_attr(object(), "_something_else")
    with pytest.raises(AssertionError, match="not listed"):
        private_name("eval_protocol.models", "EvaluationRow")


def test_a_renamed_private_attribute_fails_at_construction_naming_it() -> None:
    class RenamedProcessor(OpenEnvRolloutProcessor):
        def __getattribute__(self, name: str) -> Any:
            if name == "_env_vars":
                raise AttributeError(name)
            return super().__getattribute__(name)

    eval_test = resolve_eval_test("tests.evals.eval_letters")
    params = eval_test.wrapper.__ep_params__
    original = params.rollout_processor
    params.rollout_processor = RenamedProcessor(env_factory=parts.make_env_factory(), action_parser=parts.action_parser)
    try:
        with pytest.raises(
            UnsupportedEvalError, match=r"no attribute '_env_vars' in eval-protocol .*supports eval-protocol >="
        ):
            read_eval_spec(eval_test)
    finally:
        params.rollout_processor = original


def test_a_moved_internal_module_fails_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_private, "MODULE_NAMES", _private.MODULE_NAMES + (("eval_protocol.no_such_module", "X"),))
    with pytest.raises(UnsupportedEvalError, match=r"eval_protocol.no_such_module.X cannot be imported"):
        private_name("eval_protocol.no_such_module", "X")


def test_the_mcp_server_manager_still_lists_its_servers() -> None:
    """ep_trl finds the MCP-gym servers to hand to its watchdog in this list (ep_trl.evalprotocol.mcp_servers)."""
    from ep_trl.evalprotocol._private import SERVER_MANAGERS_ATTRIBUTE
    from ep_trl.evalprotocol.mcp_servers import MANAGER_MODULE

    manager = private_name(MANAGER_MODULE, "MCPServerManager")
    assert isinstance(private_attr(manager, SERVER_MANAGERS_ATTRIBUTE), list)


def test_the_mcp_server_manager_still_waits_for_its_server_with_a_timeout() -> None:
    """ep_trl bounds this wait (``mcp_servers.bound_server_starts``): the method and its ``timeout`` are pinned."""
    import inspect

    from ep_trl.evalprotocol._private import SERVER_READY_METHOD
    from ep_trl.evalprotocol.mcp_servers import MANAGER_MODULE

    wait = private_attr(private_name(MANAGER_MODULE, "MCPServerManager"), SERVER_READY_METHOD)
    assert "timeout" in inspect.signature(wait).parameters
