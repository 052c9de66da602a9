"""env_path resolution: every accepted form, and an error that names the problem for each bad one."""

from pathlib import Path

import pytest

from ep_trl import EnvPathError, create_openenv_vllm_rollout_func
from ep_trl.evalprotocol import resolve_eval_test

EVALS = Path(__file__).parents[1] / "evals"


def test_module_and_test_name() -> None:
    found = resolve_eval_test("tests.evals.eval_letters::test_letters_pointwise")
    assert found.name == "test_letters_pointwise"
    assert found.module_name == "tests.evals.eval_letters"
    assert hasattr(found.wrapper, "__ep_params__")


def test_module_with_exactly_one_eval_test() -> None:
    assert resolve_eval_test("tests.evals.eval_letters").name == "test_letters_pointwise"


def test_file_path_with_test_name() -> None:
    found = resolve_eval_test(f"{EVALS / 'eval_letters.py'}::test_letters_pointwise")
    assert found.name == "test_letters_pointwise"
    assert found.wrapper.__ep_params__.mode == "pointwise"


def test_relative_file_path_without_test_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(EVALS.parent.parent)
    assert resolve_eval_test("tests/evals/eval_letters_groupwise.py").name == "test_letters_groupwise"


def test_module_that_does_not_import_names_the_import_error() -> None:
    with pytest.raises(EnvPathError, match=r"Cannot import module 'tests\.evals\.no_such_eval'.*ModuleNotFoundError"):
        resolve_eval_test("tests.evals.no_such_eval::test_x")


def test_missing_file() -> None:
    with pytest.raises(EnvPathError, match="not a file"):
        resolve_eval_test("tests/evals/missing_eval.py::test_x")


def test_module_without_eval_tests() -> None:
    with pytest.raises(EnvPathError, match="contains no eval-protocol @evaluation_test"):
        resolve_eval_test("tests.evals.eval_none")


def test_several_eval_tests_are_listed() -> None:
    with pytest.raises(EnvPathError, match="several eval tests") as err:
        resolve_eval_test("tests.evals.eval_two_tests")
    assert "test_letters_first" in str(err.value) and "test_letters_second" in str(err.value)


def test_named_function_is_not_an_eval_test() -> None:
    with pytest.raises(EnvPathError, match=r"not_an_eval is not an eval-protocol @evaluation_test"):
        resolve_eval_test("tests.evals.eval_none::not_an_eval")


def test_unknown_name_lists_the_eval_tests() -> None:
    with pytest.raises(EnvPathError, match=r"no attribute 'test_nope'.*test_letters_pointwise"):
        resolve_eval_test("tests.evals.eval_letters::test_nope")


@pytest.mark.parametrize("bad", ["", "   ", "tests.evals.eval_letters::"])
def test_malformed_env_path(bad: str) -> None:
    with pytest.raises(EnvPathError):
        resolve_eval_test(bad)


def test_an_eval_with_another_processor_builds_and_says_what_plays_it(caplog: pytest.LogCaptureFixture) -> None:
    """Before the processor path, every processor but OpenEnv's was refused here."""
    caplog.set_level("INFO", logger="ep_trl")
    rollout = create_openenv_vllm_rollout_func("tests.evals.eval_single_turn", log_rollouts=False)
    try:
        assert "SingleTurnRolloutProcessor run unchanged on 1 eval rows" in caplog.text
    finally:
        rollout.close()


def test_unknown_option_is_a_type_error_naming_it() -> None:
    with pytest.raises(TypeError, match="max_turnz"):
        create_openenv_vllm_rollout_func("tests.evals.eval_letters", max_turnz=3)


def test_the_import_root_is_where_the_top_level_package_was_imported_from() -> None:
    """Relative paths in an eval (``server_script_path``, ``input_dataset``) are found under this root when the working
    directory lacks them: for a module, the directory that holds its top-level package; for a file, its directory."""
    import eval_protocol

    frozen_lake = resolve_eval_test("eval_protocol.benchmarks.test_frozen_lake::test_frozen_lake_evaluation")
    assert frozen_lake.import_root == Path(eval_protocol.__file__).resolve().parents[1]
    assert resolve_eval_test("tests.evals.eval_letters").import_root == EVALS.parent.parent.resolve()
    assert resolve_eval_test(str(EVALS / "eval_letters.py")).import_root == EVALS.resolve()


def test_an_eval_file_is_taken_from_the_working_directory_else_from_the_import_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ep_trl.evalprotocol.resolve import eval_file

    eval_test = resolve_eval_test("tests.evals.eval_letters")
    root = EVALS.parent.parent.resolve()
    monkeypatch.chdir(root)
    assert eval_file(eval_test, "tests/evals/eval_letters.py", "input_dataset").note is None
    (tmp_path / "tests" / "evals").mkdir(parents=True)
    (tmp_path / "tests" / "evals" / "eval_letters.py").write_text("# the working directory's own copy\n")
    monkeypatch.chdir(tmp_path)
    here = eval_file(eval_test, "tests/evals/eval_letters.py", "input_dataset")
    assert (here.path, here.note) == ("tests/evals/eval_letters.py", None)  # as eval-protocol reads it: from here
    monkeypatch.chdir(tmp_path / "tests")
    beside = eval_file(eval_test, "tests/evals/eval_letters.py", "server_script_path")
    assert beside.path == str(root / "tests" / "evals" / "eval_letters.py")
    assert beside.note is not None
    assert f"using {beside.path}, under the root its module was imported from" in beside.note
    assert "server_script_path 'tests/evals/eval_letters.py' is not in the working directory" in beside.note
    with pytest.raises(EnvPathError) as error:
        eval_file(eval_test, "tests/evals/no_such_file.py", "server_script_path")
    message = str(error.value)
    assert (
        f"does not exist at {tmp_path / 'tests' / 'tests' / 'evals' / 'no_such_file.py'} (from the working " in message
    )
    assert f"and {root / 'tests' / 'evals' / 'no_such_file.py'} (from the root its module tests.evals" in message
