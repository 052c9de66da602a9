"""What ep_trl reads from an eval test: its processor's settings, limits, parametrized settings and body."""

from ep_trl.evalprotocol import read_eval_spec, resolve_eval_test
from tests.evals import letters_parts as parts


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


def test_an_eval_whose_guarded_import_failed_is_named_as_such(monkeypatch):
    """eval-protocol's example evals set the client to None when its import fails and pass
    rollout_processor=None, which eval-protocol replaces with SingleTurnRolloutProcessor."""
    import importlib
    import sys

    import pytest

    from ep_trl import UnsupportedEvalError

    monkeypatch.setitem(sys.modules, "tests.fixtures.guess_env", None)  # fault injection: the package is missing
    monkeypatch.delitem(sys.modules, "tests.evals.eval_guess_hub", raising=False)
    module = importlib.import_module("tests.evals.eval_guess_hub")
    try:
        with pytest.raises(UnsupportedEvalError, match=r"uses SingleTurnRolloutProcessor.*GuessEnv is None: the "
                                                       r"module probably guards an import that failed"):
            read_eval_spec(resolve_eval_test("tests.evals.eval_guess_hub"))
    finally:
        sys.modules.pop(module.__name__, None)


def test_history_line_with_the_label_already_computed_is_the_same_line():
    """The episode loop names each action once (``action_label``) for its actions and its history line; the line is
    the one ``history_line`` builds from the action itself, for actions with and without ``action_str``."""
    from ep_trl.envs.letters import LettersAction
    from ep_trl.evalprotocol.spec import action_label, history_line

    class Named:
        action_str = "click('7')"

    class Observed:
        last_action_error = True

    for action in (LettersAction(text="aei"), Named(), "plain", 42):
        for step, reward, observation in ((1, 0.5, None), (3, -1.0, Observed())):
            assert history_line(step, action, reward, observation, action_label(action)) == \
                history_line(step, action, reward, observation)
    letters = LettersAction(text="aei")
    assert action_label(Named()) == "click('7')" and action_label(letters) == str(letters)
