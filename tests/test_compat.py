"""The old names users were shown (``ep_trl.compat``): each old module path still imports, warns with its new path and
the release that removes it, and is the new module object itself (so patching either name patches the same module);
the module paths before issue 41's regrouping are gone."""

import importlib
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import ep_trl
from ep_trl.compat import MOVED, REMOVED_IN

SRC = Path(ep_trl.__file__).resolve().parent


def test_every_moved_path_names_an_existing_module_and_no_old_file_is_left() -> None:
    assert sorted(MOVED) == ["ep_trl.serve", "ep_trl.shutdown"]
    for old, new in MOVED.items():
        new_path = SRC.parent.joinpath(*new.split("."))
        assert new_path.with_suffix(".py").is_file() or (new_path / "__init__.py").is_file(), new
        old_path = SRC.parent.joinpath(*old.split("."))
        assert not old_path.with_suffix(".py").exists() and not old_path.is_dir(), f"{old} is still a file"


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_path_warns_and_is_the_new_module(old: str) -> None:
    new = importlib.import_module(MOVED[old])
    sys.modules.pop(old, None)  # an earlier import of the old path would not warn again
    with pytest.warns(
        DeprecationWarning, match=f"{old} moved to {MOVED[old]}.*removed in ep_trl {REMOVED_IN}"
    ) as caught:
        alias = importlib.import_module(old)
    assert alias is new
    assert (
        alias.__name__ == MOVED[old] and alias.__spec__ is not None and alias.__spec__.name == MOVED[old]
    )  # the new module's own spec kept
    assert len([w for w in caught if issubclass(w.category, DeprecationWarning)]) == 1


def test_patching_the_old_path_patches_the_new_module(monkeypatch: pytest.MonkeyPatch) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        # the old path as a user's import statement names it: ep_trl.compat makes that module at import time, so
        # there is no file for mypy to find
        import ep_trl.shutdown as old  # type: ignore[import-not-found]
    from ep_trl.runtime import shutdown

    monkeypatch.setattr("ep_trl.shutdown.CLOSE_RESERVE_S", 123.0)
    assert shutdown.CLOSE_RESERVE_S == 123.0 and old is shutdown


@pytest.mark.parametrize("old", ["ep_trl.rollout", "ep_trl.env_pool", "ep_trl.processors.endpoint", "ep_trl.guard"])
def test_the_paths_before_the_regrouping_are_gone(old: str) -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(old)


def test_the_trajectory_package_holds_no_names_of_its_modules() -> None:
    with pytest.raises(ImportError):
        # the name is gone on purpose: the import must fail
        from ep_trl.trajectory import ChatTemplate  # type: ignore[attr-defined]  # noqa: F401


def test_a_keyword_that_moved_into_an_option_object_is_named_with_its_new_home() -> None:
    with pytest.raises(TypeError, match=r"'vllm_max_retries'.*it is now vllm=VLLMOptions\(max_retries=\.\.\.\)"):
        ep_trl.create_rollout_func("tests.evals.eval_letters::test_letters_pointwise", vllm_max_retries=3)


def test_python_dash_m_runs_an_old_path() -> None:
    """``python -m ep_trl.serve`` (the README's command before ``ep-trl serve``) still runs ``ep_trl.cli.serve``."""
    done = subprocess.run(
        [sys.executable, "-W", "always::DeprecationWarning", "-m", "ep_trl.serve", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "MODEL_DIR" in done.stdout or "model" in done.stdout.lower()
    assert "ep_trl.serve moved to ep_trl.cli.serve" in done.stderr
