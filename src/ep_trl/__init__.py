"""ep_trl: an eval-protocol ``@evaluation_test`` as a token-exact TRL GRPO ``rollout_func``.

>>> from ep_trl import create_openenv_vllm_rollout_func
>>> from ep_trl.rewards import eval_score
>>> rollout_func = create_openenv_vllm_rollout_func(env_path="my_evals.test_env::test_name")

The public API is what this docstring lists; every other module is internal (docs/architecture.md):

* ``create_openenv_vllm_rollout_func(env_path, ...)`` (alias ``create_rollout_func``) → ``RolloutFunction``, the
  ``rollout_func`` for ``GRPOTrainer``, for an eval with any eval-protocol processor (docs/processors.md); its
  option objects ``EvalOverrides`` (replace the eval's settings), ``VLLMOptions`` (the vLLM
  server backend) and ``RolloutOptions`` (the bridge itself);
* ``dataset_from_eval(env_path, repeat=1)``: the eval's own input rows as a TRL training dataset;
* ``EvalRolloutWorker(env_path, args=..., processing_class=...)``: the eval as the rollout worker of TRL's
  ``AsyncGRPOTrainer`` (docs/async.md);
* ``ep_trl.rewards``: ``eval_score``, ``step_reward_sum``, ``step_reward_mean``, ``step_reward_max``;
* ``ep_trl.trainers``: trainers that stand in for TRL's where TRL's cannot run on CPU or drop what a rollout returns:
  ``disk_sync.DiskSyncGRPOTrainer`` (a local vLLM server kept on the trainer's weights),
  ``cpu_colocate.CPUColocateGRPOTrainer`` (TRL's colocated engine on CPU), ``cpu_async.CPUAsyncGRPOTrainer``
  (``AsyncGRPOTrainer`` on CPU), ``disk_weights.DiskWeightTransfer`` (``AsyncGRPOTrainer``'s weight sync without
  NCCL), ``images.RolloutImagesGRPOTrainer`` (a ``GRPOTrainer`` whose forward passes see the images a rollout
  returns: a vision-language model on an eval's screenshots; docs/browsergym.md);
* errors: ``EpTrlError`` and its subclasses ``ConfigError``, ``EnvPathError``, ``UnsupportedEvalError``,
  ``VersionError``, ``GenerationError``, ``NoTrainingSignalError``, ``RolloutWorkerError``, ``ProcessExitingError``;
* ``ep_trl.envs``: the project's own OpenEnv environments (``letters``, ``browsergym``);
* ``ep-trl train ENV_PATH --model MODEL``: the command line (``ep_trl.cli``, docs/cli.md); ``ep-trl serve MODEL_DIR``:
  a local model behind the endpoint training uses, to run the same eval file under ``pytest`` (docs/processors.md);
* ``ep_trl.devtools``: development tooling for scripts and tests (tiny model, local servers, progress lines).
"""

import importlib.abc
import sys
from types import ModuleType
from typing import TYPE_CHECKING

from .errors import (
    ConfigError,
    EnvPathError,
    EpTrlError,
    GenerationError,
    NoTrainingSignalError,
    ProcessExitingError,
    RolloutWorkerError,
    UnsupportedEvalError,
    VersionError,
)
from .options import EvalOverrides, RolloutOptions, VLLMOptions

if TYPE_CHECKING:
    from collections.abc import Sequence
    from importlib.machinery import ModuleSpec
    from types import CodeType

    from .adapters.async_worker import EvalRolloutWorker
    from .adapters.rollout_func import RolloutFunction, create_openenv_vllm_rollout_func, create_rollout_func
    from .dataset import dataset_from_eval

#: The public names whose modules import eval-protocol, aiohttp, transformers and the rest of the bridge: imported
#: at their first use (``from ep_trl import X`` or ``ep_trl.X``), so that ``import ep_trl`` alone (a shard process,
#: a script's ``--help``, the errors and options) costs no more than the errors and options (tests/test_import.py).
_LAZY = {"dataset_from_eval": "dataset", "RolloutFunction": "adapters.rollout_func",
         "create_openenv_vllm_rollout_func": "adapters.rollout_func", "create_rollout_func": "adapters.rollout_func",
         "EvalRolloutWorker": "adapters.async_worker"}


def __getattr__(name: str) -> object:
    home = _LAZY.get(name)
    module: ModuleType
    if home == "dataset":
        from . import dataset as module
    elif home == "adapters.rollout_func":
        from .adapters import rollout_func as module
    elif home == "adapters.async_worker":
        from .adapters import async_worker as module
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(module, name)
    globals()[name] = value  # the next lookup finds it without this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


#: The module paths ep_trl had before issue 41 grouped its modules into packages, and their homes now. An old path
#: still imports (a user's script, a pickled name, ``python -m``): it warns and is the new module object itself, so
#: patching either name patches the same module. (``ep_trl.trajectory`` is the package that holds the old module's
#: code in ``ep_trl.trajectory.tokens``; it gives its names without a warning.)
MOVED = {
    "ep_trl.rollout": "ep_trl.adapters.rollout_func",
    "ep_trl.rollout_worker": "ep_trl.adapters.async_worker",
    "ep_trl.shards": "ep_trl.adapters.sharded",
    "ep_trl.output": "ep_trl.adapters.output",
    "ep_trl.trl_compat": "ep_trl.adapters.trl_seam",
    "ep_trl.caller": "ep_trl.engine.caller",
    "ep_trl.call_setup": "ep_trl.engine.call_setup",
    "ep_trl.settings": "ep_trl.engine.settings",
    "ep_trl.stream": "ep_trl.engine.stream",
    "ep_trl.scoring": "ep_trl.engine.scoring",
    "ep_trl.metrics": "ep_trl.engine.metrics",
    "ep_trl.backend_choice": "ep_trl.generation.choice",
    "ep_trl.environment": "ep_trl.openenv.client",
    "ep_trl.env_pool": "ep_trl.openenv.pool",
    "ep_trl.env_servers": "ep_trl.openenv.servers",
    "ep_trl.local_provider": "ep_trl.openenv.local_provider",
    "ep_trl.episode": "ep_trl.openenv.loop",
    "ep_trl.sources.openenv": "ep_trl.openenv.source",
    "ep_trl.processors": "ep_trl.capture",
    "ep_trl.processors.endpoint": "ep_trl.capture.endpoint",
    "ep_trl.processors.capture": "ep_trl.capture.placement",
    "ep_trl.processors.wire": "ep_trl.capture.wire",
    "ep_trl.processors.parsing": "ep_trl.capture.parsing",
    "ep_trl.threads": "ep_trl.runtime.threads",
    "ep_trl.processes": "ep_trl.runtime.processes",
    "ep_trl.guard": "ep_trl.runtime.guard",
    "ep_trl.shutdown": "ep_trl.runtime.shutdown",
    "ep_trl.runner": "ep_trl.runtime.runner",
    "ep_trl.versions": "ep_trl.runtime.versions",
    "ep_trl.rows": "ep_trl.traininglog.rows",
    "ep_trl.rollout_log": "ep_trl.traininglog.writer",
    "ep_trl.content": "ep_trl.trajectory.content",
    "ep_trl.sample_images": "ep_trl.trajectory.sample_images",
    "ep_trl.vision_inputs": "ep_trl.trajectory.vision_inputs",
    "ep_trl.serve": "ep_trl.cli.serve",
}


class _MovedModuleFinder:
    """Finds an old module path of :data:`MOVED` before the path finder does (which would find a second copy of a
    moved module in a renamed package: ``ep_trl.processors.endpoint`` in ``capture/``)."""

    @staticmethod
    def find_spec(fullname: str, path: "Sequence[str] | None" = None,
                  target: ModuleType | None = None) -> "ModuleSpec | None":
        new = MOVED.get(fullname)
        if new is None:
            return None
        import importlib.util

        real = importlib.util.find_spec(new)
        return importlib.util.spec_from_loader(fullname, _MovedModuleLoader(fullname, new),
                                               origin=real.origin if real else None)


class _MovedModuleLoader(importlib.abc.Loader):
    """Loads an old path as the module at its new path, with a ``DeprecationWarning`` that names the new path."""

    def __init__(self, old: str, new: str) -> None:
        self.old, self.new = old, new
        self.real_spec: ModuleSpec | None = None

    def _warn(self) -> None:
        import warnings

        warnings.warn(f"{self.old} moved to {self.new}; import {self.new} instead (the old path will be removed)",
                      DeprecationWarning, stacklevel=3)

    def create_module(self, spec: "ModuleSpec") -> "ModuleType":
        import importlib

        self._warn()
        module = importlib.import_module(self.new)
        self.real_spec = module.__spec__
        return module

    def exec_module(self, module: "ModuleType") -> None:
        module.__spec__ = self.real_spec  # the import system set the old path's spec on the (already run) module

    def get_code(self, fullname: str) -> "CodeType | None":
        """The new module's code: ``python -m <old path>`` runs it (runpy asks for the code, not the module)."""
        import importlib.util

        self._warn()
        real = importlib.util.find_spec(self.new)
        assert real is not None and real.loader is not None
        return real.loader.get_code(self.new)  # type: ignore[attr-defined]


if not any(isinstance(finder, _MovedModuleFinder) for finder in sys.meta_path):
    sys.meta_path.insert(0, _MovedModuleFinder())


__all__ = [
    "ConfigError",
    "EnvPathError",
    "EpTrlError",
    "EvalRolloutWorker",
    "EvalOverrides",
    "GenerationError",
    "NoTrainingSignalError",
    "ProcessExitingError",
    "RolloutFunction",
    "RolloutOptions",
    "RolloutWorkerError",
    "UnsupportedEvalError",
    "VLLMOptions",
    "VersionError",
    "create_openenv_vllm_rollout_func",
    "create_rollout_func",
    "dataset_from_eval",
]
__version__ = "0.1.0"
