"""The one home of ep_trl's old names: what the README and docs once showed users, kept working until
:data:`REMOVED_IN`.

* :data:`MOVED`: module paths users were shown, now elsewhere. ``python -m ep_trl.serve`` (the README's command before
  ``ep-trl serve``) and ``ep_trl.shutdown.Terminated`` (the exception a SIGTERM raises, which ``docs/failures.md``
  told programs to expect). An old path imports with a ``DeprecationWarning`` naming its new home, and is the new
  module object itself, so patching either name patches the same module.
* :data:`MOVED_KEYWORDS`: keywords of ``create_openenv_vllm_rollout_func`` that moved into its option objects; a call
  that passes one gets a ``TypeError`` naming where it lives now.

Every other internal path (the modules' homes before issue 41 grouped them into packages) is gone: internal modules
may change between releases (docs/architecture.md). ``import ep_trl`` installs the finder.
"""

import importlib.abc
import importlib.util
import sys
import warnings
from dataclasses import fields
from importlib.machinery import ModuleSpec
from types import CodeType, ModuleType
from typing import Mapping, Sequence

from .options import EvalOverrides, RolloutOptions, VLLMOptions

#: The release that removes the old names below.
REMOVED_IN = "0.2.0"

#: Old module path → its home now.
MOVED = {
    "ep_trl.serve": "ep_trl.cli.serve",
    "ep_trl.shutdown": "ep_trl.runtime.shutdown",
}

#: Keywords of earlier releases → where they live now.
MOVED_KEYWORDS = {
    **{f.name: f"overrides=EvalOverrides({f.name}=...)" for f in fields(EvalOverrides)},
    **{f"vllm_{f.name}": f"vllm=VLLMOptions({f.name}=...)" for f in fields(VLLMOptions)},
    **{f.name: f"options=RolloutOptions({f.name}=...)" for f in fields(RolloutOptions)},
}


def refuse_unknown(unknown: Mapping[str, object]) -> None:
    """A TypeError for keywords the factory does not take, saying where a keyword of an earlier release lives now."""
    for name in unknown:
        hint = f"; it is now {MOVED_KEYWORDS[name]}" if name in MOVED_KEYWORDS else ""
        raise TypeError(f"create_openenv_vllm_rollout_func() got an unexpected keyword argument {name!r}{hint}")


class MovedModuleFinder:
    """Finds an old module path of :data:`MOVED` before the path finder does."""

    @staticmethod
    def find_spec(
        fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        new = MOVED.get(fullname)
        if new is None:
            return None
        real = importlib.util.find_spec(new)
        return importlib.util.spec_from_loader(
            fullname, _MovedModuleLoader(fullname, new), origin=real.origin if real else None
        )


class _MovedModuleLoader(importlib.abc.Loader):
    """Loads an old path as the module at its new path, with a ``DeprecationWarning`` that names the new path."""

    def __init__(self, old: str, new: str) -> None:
        self.old, self.new = old, new
        self.real_spec: ModuleSpec | None = None

    def _warn(self) -> None:
        warnings.warn(
            f"{self.old} moved to {self.new}; import {self.new} instead ({self.old} is removed in ep_trl {REMOVED_IN})",
            DeprecationWarning,
            stacklevel=3,
        )

    def create_module(self, spec: ModuleSpec) -> ModuleType:
        self._warn()
        module = importlib.import_module(self.new)
        self.real_spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self.real_spec  # the import system set the old path's spec on the (already run) module

    def get_code(self, fullname: str) -> CodeType | None:
        """``python -m <old path>``: code that runs the new module as ``__main__`` (runpy asks for the code, not the
        module; the new module's own code would run with the old path's package, where its relative imports fail)."""
        self._warn()
        return compile(
            f"import runpy\nrunpy.run_module({self.new!r}, run_name='__main__', alter_sys=True)\n",
            f"<{self.old}: runs {self.new}>",
            "exec",
        )


def install() -> None:
    """Put :class:`MovedModuleFinder` first on ``sys.meta_path`` (once)."""
    if not any(isinstance(finder, MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, MovedModuleFinder())
