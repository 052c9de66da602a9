"""The rollout engine: built from ``env_path`` in one factory, wrapped by the adapters, closed with them."""

from dataclasses import replace

import pytest

from ep_trl import create_openenv_vllm_rollout_func
from ep_trl.adapters.rollout_func import RolloutFunction
from ep_trl.engine.engine import RolloutEngine, build_engine
from ep_trl.errors import ConfigError
from ep_trl.runtime import shutdown

LETTERS = "tests.evals.eval_letters::test_letters_pointwise"


def registered(resource: object) -> bool:
    return any(value is resource for value in shutdown._registered.values())


def test_build_engine_checks_the_keywords_an_adapter_passes_on() -> None:
    """The async worker hands its user's keywords to ``build_engine``: they are checked as the factory checks them."""
    with pytest.raises(TypeError, match="unexpected keyword argument 'reuse_env_sessions'; it is now"):
        build_engine(LETTERS, reuse_env_sessions=True)
    with pytest.raises(ConfigError, match="ends with /v1"):
        build_engine(LETTERS, vllm_base_url="http://127.0.0.1:8000/v1")


def test_the_rollout_function_wraps_one_engine_and_closes_it() -> None:
    rollout = create_openenv_vllm_rollout_func(LETTERS, log_rollouts=False, max_concurrent_rollouts=3)
    try:
        assert isinstance(rollout, RolloutFunction) and isinstance(rollout.engine, RolloutEngine)
        engine = rollout.engine
        assert rollout.spec is engine.spec and engine.spec.max_concurrent_rollouts == 3
        assert rollout.source is engine.source and rollout.invocation_id == engine.invocation_id
        assert rollout.log_writer is None and rollout.backend_name == "auto" and rollout.env_sessions == 0
        assert registered(engine)  # closed at the process's exit unless closed before
        rollout.spec = replace(engine.spec, max_concurrent_rollouts=2)
        assert engine.spec.max_concurrent_rollouts == 2  # the users' setter replaces the engine's spec
    finally:
        rollout.close()
    assert not registered(engine)
