"""Resolve ``env_path`` to exactly one eval-protocol ``@evaluation_test``.

Accepted forms:

* ``"pkg.module::test_name"`` - a named test in an importable module;
* ``"pkg.module"`` - the module's only eval test (an error lists them when there are several);
* ``"path/to/file.py::test_name"`` and ``"path/to/file.py"`` - the same, from a file on disk.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Protocol

from ..errors import EnvPathError

if TYPE_CHECKING:  # eval-protocol ships no types: to the checker the name documents what the wrapper holds
    from eval_protocol.models import EPParameters


class EvalWrapper(Protocol):
    """An ``@evaluation_test`` wrapper, as ep_trl reads it: the parameters eval-protocol attaches to it."""

    __ep_params__: EPParameters


@dataclass(frozen=True)
class EvalTest:
    """One ``@evaluation_test``: the decorated wrapper and where it came from."""

    env_path: str
    module_name: str
    name: str
    wrapper: EvalWrapper

    @property
    def qualified_name(self) -> str:
        return f"{self.module_name}::{self.name}"

    @property
    def import_root(self) -> Path | None:
        """The directory the eval's module was imported from: the one holding its top-level package (for
        ``eval_protocol.benchmarks.test_frozen_lake``, the site-packages that holds ``eval_protocol/``), or the
        file's own directory for an eval imported from a file path; None for a module without a file."""
        module = sys.modules.get(self.module_name)
        filename = getattr(module, "__file__", None)
        if not filename:
            return None
        path = Path(filename).resolve()
        depth = self.module_name.count(".") + (1 if path.stem == "__init__" else 0)
        return path.parents[depth] if depth < len(path.parents) else None


@dataclass(frozen=True)
class EvalFile:
    """A path an eval names (``server_script_path``, an ``input_dataset`` file), as training uses it."""

    given: str
    path: str
    #: Why ``path`` differs from ``given`` (None when the path is used as given).
    note: str | None = None


def eval_file(eval_test: EvalTest, given: str, what: str) -> EvalFile:
    """``given`` as the eval names it: an absolute path, or a relative one that exists from the working directory (as
    eval-protocol reads it), is used as given; a relative path that does not is taken from the root the eval's
    module was imported from (:attr:`EvalTest.import_root`), when it exists there, made absolute. Neither: an
    ``EnvPathError`` naming both places."""
    path = Path(given).expanduser()
    if path.is_absolute() or path.exists():
        return EvalFile(given=given, path=given)
    root = eval_test.import_root
    beside = root / path if root is not None else None
    if beside is not None and beside.exists():
        return EvalFile(
            given=given,
            path=str(beside),
            note=(
                f"{eval_test.qualified_name}: its {what} {given!r} is not in the working directory ({Path.cwd()}); "
                f"using {beside}, under the root its module was imported from"
            ),
        )
    places = f"{Path.cwd() / path} (from the working directory)"
    if beside is not None:
        places += f" and {beside} (from the root its module {eval_test.module_name} was imported from)"
    raise EnvPathError(
        f"{eval_test.qualified_name}: its {what} {given!r} is relative and does not exist at {places}. Run from the "
        "directory the eval's paths are relative to (the eval's own repository), or point the eval at an absolute "
        "path."
    )


def is_eval_test(obj: object) -> bool:
    """eval-protocol attaches ``__ep_params__`` to every ``@evaluation_test`` wrapper."""
    return callable(obj) and hasattr(obj, "__ep_params__")


def resolve_eval_test(env_path: str) -> EvalTest:
    """Import the module ``env_path`` names and return its eval test, or raise a helpful ``EnvPathError``."""
    if not isinstance(env_path, str) or not env_path.strip():
        raise EnvPathError(
            "env_path must be a non-empty string such as 'my_evals.test_browsergym::test_click' "
            f"or 'path/to/eval.py::test_click'; got {env_path!r}."
        )
    target, sep, test_name = env_path.strip().partition("::")
    if sep and not test_name:
        raise EnvPathError(f"env_path {env_path!r} ends with '::' but names no test; write 'module::test_name'.")
    module = _import_target(target, env_path)
    tests = {name: obj for name, obj in inspect.getmembers(module) if is_eval_test(obj)}
    if test_name:
        if test_name not in vars(module):
            available = ", ".join(sorted(tests)) or "none"
            raise EnvPathError(
                f"{module.__name__} has no attribute {test_name!r} (env_path {env_path!r}). "
                f"Eval tests in that module: {available}."
            )
        obj = getattr(module, test_name)
        if not is_eval_test(obj):
            raise EnvPathError(
                f"{module.__name__}::{test_name} is not an eval-protocol @evaluation_test "
                "(it has no __ep_params__). Decorate it with @evaluation_test(...) or point env_path at one that is."
            )
        return EvalTest(env_path=env_path, module_name=module.__name__, name=test_name, wrapper=obj)
    if not tests:
        raise EnvPathError(
            f"{module.__name__} (env_path {env_path!r}) contains no eval-protocol @evaluation_test. "
            "Point env_path at the module that defines your eval, e.g. 'my_evals.test_env::test_name'."
        )
    if len(tests) > 1:
        names = ", ".join(sorted(tests))
        raise EnvPathError(
            f"{module.__name__} contains several eval tests ({names}); name one: "
            f"env_path='{target}::{sorted(tests)[0]}'."
        )
    ((name, obj),) = tests.items()
    return EvalTest(env_path=env_path, module_name=module.__name__, name=name, wrapper=obj)


def _import_target(target: str, env_path: str) -> ModuleType:
    if target.endswith(".py") or "/" in target or "\\" in target:
        return _import_file(Path(target), env_path)
    try:
        return importlib.import_module(target)
    except ImportError as exc:
        raise EnvPathError(
            f"Cannot import module {target!r} from env_path {env_path!r}: {type(exc).__name__}: {exc}. "
            "Check the spelling, that its package is installed or on PYTHONPATH, or pass a file path "
            "('path/to/eval.py::test_name')."
        ) from exc
    except Exception as exc:
        raise EnvPathError(
            f"Importing {target!r} (env_path {env_path!r}) raised {type(exc).__name__}: {exc}. Fix the module so it "
            "imports."
        ) from exc


def _import_file(path: Path, env_path: str) -> ModuleType:
    path = path.expanduser().resolve()
    if not path.is_file():
        raise EnvPathError(f"env_path {env_path!r} points at {path}, which is not a file.")
    module_name = f"ep_trl_eval_{path.stem}_{abs(hash(str(path))) & 0xFFFFFF:06x}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise EnvPathError(f"Cannot load {path} as a Python module (env_path {env_path!r}).")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    # Eval files commonly import helpers that sit beside them.
    parent = str(path.parent)
    if parent not in sys.path:
        sys.path.insert(0, parent)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[module_name]
        raise EnvPathError(
            f"Importing {path} (env_path {env_path!r}) raised {type(exc).__name__}: {exc}. Fix the file so it imports."
        ) from exc
    return module
