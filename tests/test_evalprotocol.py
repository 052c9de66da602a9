"""The eval-protocol seam: what it reads from an eval, and a loud failure if eval-protocol renames it."""

import asyncio

import pytest
from eval_protocol.pytest.openenv_rollout_processor import OpenEnvRolloutProcessor

from ep_trl import UnsupportedEvalError
from ep_trl.evalprotocol import build_row, read_eval_spec, run_body, score_of
from ep_trl.evaltest import resolve_eval_test
from tests.evals import letters_parts as parts

# The private attributes of OpenEnvRolloutProcessor that ep_trl reads. If eval-protocol renames one, this fails
# first, naming it, and ep_trl.evalprotocol must be updated.
PRIVATE_ATTRIBUTES = ("_provided_env_factory", "_env_client_cls", "_env_base_url", "_request_timeout_s",
                      "_default_headers", "_tasks", "_task_var", "_env_vars", "_docker_image", "_hub_repo_id")


def test_processor_still_has_the_private_attributes_we_read():
    processor = OpenEnvRolloutProcessor(env_factory=parts.make_env_factory(), action_parser=parts.action_parser,
                                        tasks=["vowels"], task_var="X", request_timeout_s=7.0)
    missing = [name for name in PRIVATE_ATTRIBUTES if not hasattr(processor, name)]
    assert not missing, f"eval-protocol renamed {missing}; update ep_trl/evalprotocol.py"
    wrapper = resolve_eval_test("tests.evals.eval_letters").wrapper
    assert callable(wrapper._origin_func) and wrapper.__ep_params__.steps == parts.STEPS


def test_spec_carries_the_evals_configuration():
    spec = read_eval_spec(resolve_eval_test("tests.evals.eval_letters"))
    assert spec.mode == "pointwise"
    assert spec.max_steps == parts.STEPS
    assert spec.max_concurrent_rollouts == parts.MAX_CONCURRENT_ROLLOUTS
    assert spec.completion_params == parts.COMPLETION_PARAMS[0]
    assert dict(spec.evaluation_test_kwargs) == {"bonus": 0.0}
    assert spec.env.tasks == ("vowels", "digits") and spec.env.task_var == parts.TASK_VAR
    assert spec.prompt_builder is parts.prompt_builder and spec.action_parser is parts.action_parser
    assert spec.env.factory is not None


def test_a_renamed_private_attribute_fails_at_construction_naming_it():
    class RenamedProcessor(OpenEnvRolloutProcessor):
        def __getattribute__(self, name):
            if name == "_env_vars":
                raise AttributeError(name)
            return super().__getattribute__(name)

    eval_test = resolve_eval_test("tests.evals.eval_letters")
    params = eval_test.wrapper.__ep_params__
    original = params.rollout_processor
    params.rollout_processor = RenamedProcessor(env_factory=parts.make_env_factory(), action_parser=parts.action_parser)
    try:
        with pytest.raises(UnsupportedEvalError, match="no attribute '_env_vars' in eval-protocol"):
            read_eval_spec(eval_test)
    finally:
        params.rollout_processor = original


def test_body_runs_on_a_row_shaped_like_the_processors():
    spec = read_eval_spec(resolve_eval_test("tests.evals.eval_letters"))
    row = build_row(messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "aeiou"}],
                    eval_name=spec.name, row_id="r", rollout_id="x", invocation_id="i", experiment_id="e",
                    run_id="s", completion_params={}, extra={"step_rewards": [1.0, 0.5]})
    (scored,) = asyncio.run(run_body(spec, [row]))
    assert score_of(scored) == pytest.approx(0.75)
    assert scored.execution_metadata.rollout_id == "x"
