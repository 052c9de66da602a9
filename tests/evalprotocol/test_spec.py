"""What ep_trl reads from an eval test: its processor's settings, limits, parametrized settings and body."""

from pathlib import Path

import pytest

from ep_trl.evalprotocol import read_eval_spec, resolve_eval_test
from tests.evals import letters_parts as parts


def test_spec_carries_the_evals_configuration() -> None:
    spec = read_eval_spec(resolve_eval_test("tests.evals.eval_letters"))
    assert spec.mode == "pointwise"
    assert spec.max_steps == parts.STEPS
    assert spec.max_concurrent_rollouts == parts.MAX_CONCURRENT_ROLLOUTS
    assert spec.completion_params == parts.COMPLETION_PARAMS[0]
    assert dict(spec.evaluation_test_kwargs) == {"bonus": 0.0}
    assert spec.env is not None
    assert spec.env.tasks == ("vowels", "digits") and spec.env.task_var == parts.TASK_VAR
    assert spec.prompt_builder is parts.prompt_builder and spec.action_parser is parts.action_parser
    assert spec.env.factory is not None


def test_an_eval_whose_guarded_import_failed_is_named_as_such(monkeypatch: pytest.MonkeyPatch) -> None:
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
        with pytest.raises(
            UnsupportedEvalError,
            match=r"uses SingleTurnRolloutProcessor.*GuessEnv is None: the "
            r"module probably guards an import that failed",
        ):
            read_eval_spec(resolve_eval_test("tests.evals.eval_guess_hub"))
    finally:
        sys.modules.pop(module.__name__, None)


def test_history_line_with_the_label_already_computed_is_the_same_line() -> None:
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
            assert history_line(step, action, reward, observation, action_label(action)) == history_line(
                step, action, reward, observation
            )
    letters = LettersAction(text="aei")
    assert action_label(Named()) == "click('7')" and action_label(letters) == str(letters)


FROZEN_LAKE = "eval_protocol.benchmarks.test_frozen_lake::test_frozen_lake_evaluation"
#: ``server_script_path`` of eval-protocol's FrozenLake benchmark: relative to eval-protocol's repository.
SERVER_SCRIPT = "eval_protocol/mcp_servers/frozen_lake/server.py"


def test_a_relative_server_script_missing_here_is_the_one_beside_the_evals_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """eval-protocol's FrozenLake benchmark names its MCP server relative to its repository; installed, the server is
    under site-packages. Before, MCPGymRolloutProcessor got the relative path and its server failed to start outside
    eval-protocol's checkout."""
    from pathlib import Path

    import eval_protocol

    installed = Path(eval_protocol.__file__).resolve().parent / "mcp_servers" / "frozen_lake" / "server.py"
    monkeypatch.chdir(tmp_path)
    spec = read_eval_spec(resolve_eval_test(FROZEN_LAKE))
    assert spec.processor_settings["server_script_path"] == str(installed)
    assert any(
        f"its server_script_path {SERVER_SCRIPT!r} is not in the working directory ({tmp_path}); using "
        f"{installed}" in note
        for note in spec.notes
    ), spec.notes
    (tmp_path / "eval_protocol").symlink_to(installed.parents[2])  # a checkout of eval-protocol: the path as given
    spec = read_eval_spec(resolve_eval_test(FROZEN_LAKE))
    assert spec.processor_settings["server_script_path"] == SERVER_SCRIPT
    assert not any("server_script_path" in note for note in spec.notes)


def test_a_server_script_found_nowhere_is_refused_naming_both_places(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pytest

    from ep_trl import EnvPathError

    (tmp_path / "evals").mkdir()
    (tmp_path / "evals" / "eval_lost_server.py").write_text(
        "from eval_protocol.models import EvaluationRow, Message\n"
        "from eval_protocol.pytest import evaluation_test\n"
        "from eval_protocol.pytest.default_mcp_gym_rollout_processor import MCPGymRolloutProcessor\n\n\n"
        "@evaluation_test(input_messages=[[[Message(role='user', content='walk')]]], completion_params=[{'model': "
        "'m'}],\n"
        "                 rollout_processor=MCPGymRolloutProcessor(), server_script_path='servers/lake.py',\n"
        "                 mode='pointwise')\n"
        "def test_lost(row: EvaluationRow) -> EvaluationRow:\n"
        "    return row\n"
    )
    (tmp_path / "run").mkdir()
    monkeypatch.chdir(tmp_path / "run")
    with pytest.raises(EnvPathError) as error:
        read_eval_spec(resolve_eval_test(str(tmp_path / "evals" / "eval_lost_server.py")))
    message = str(error.value)
    assert (
        f"its server_script_path 'servers/lake.py' is relative and does not exist at "
        f"{tmp_path / 'run' / 'servers' / 'lake.py'} (from the working directory) and "
        f"{tmp_path / 'evals' / 'servers' / 'lake.py'} (from the root its module"
    ) in message
