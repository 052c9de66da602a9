"""The module paths ep_trl had before issue 41 grouped its modules into packages: each still imports, warns with its
new path, and is the new module object itself (so patching either name patches the same module)."""

import importlib
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import ep_trl
from ep_trl import MOVED

SRC = Path(ep_trl.__file__).resolve().parent


def test_every_moved_path_names_an_existing_module_and_no_old_file_is_left():
    for old, new in MOVED.items():
        new_path = SRC.parent.joinpath(*new.split("."))
        assert new_path.with_suffix(".py").is_file() or (new_path / "__init__.py").is_file(), new
        old_path = SRC.parent.joinpath(*old.split("."))
        assert not old_path.with_suffix(".py").exists() and not old_path.is_dir(), f"{old} is still a file"


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_path_warns_and_is_the_new_module(old):
    new = importlib.import_module(MOVED[old])
    sys.modules.pop(old, None)  # an earlier import of the old path would not warn again
    with pytest.warns(DeprecationWarning, match=f"{old} moved to {MOVED[old]}") as caught:
        alias = importlib.import_module(old)
    assert alias is new
    assert alias.__name__ == MOVED[old] and alias.__spec__.name == MOVED[old]  # the new module's own spec kept
    assert len([w for w in caught if issubclass(w.category, DeprecationWarning)]) == 1


def test_patching_the_old_path_patches_the_new_module(monkeypatch):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import ep_trl.shutdown as old
    from ep_trl.runtime import shutdown

    monkeypatch.setattr("ep_trl.shutdown.CLOSE_RESERVE_S", 123.0)
    assert shutdown.CLOSE_RESERVE_S == 123.0 and old is shutdown


def test_from_an_old_package_import_a_moved_module():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from ep_trl.processors import endpoint
    from ep_trl.capture import endpoint as new

    assert endpoint is new


def test_the_trajectory_package_gives_the_old_modules_names_without_a_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        from ep_trl.trajectory import ChatTemplate, TrajectoryBuilder
    from ep_trl.trajectory import tokens

    assert ChatTemplate is tokens.ChatTemplate and TrajectoryBuilder is tokens.TrajectoryBuilder
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        getattr(importlib.import_module("ep_trl.trajectory"), "no_such_name")


def test_python_dash_m_runs_an_old_path():
    """``python -m ep_trl.guard`` (the watchdog's old path) still runs the module, now ``ep_trl.runtime.guard``."""
    done = subprocess.run([sys.executable, "-W", "always::DeprecationWarning", "-m", "ep_trl.guard", "--help"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "--parent" in done.stdout
    assert "ep_trl.guard moved to ep_trl.runtime.guard" in done.stderr
