"""ep_trl: an eval-protocol ``@evaluation_test`` as a token-exact TRL GRPO ``rollout_func``.

>>> from ep_trl import create_openenv_vllm_rollout_func
>>> from ep_trl.rewards import eval_score
>>> rollout_func = create_openenv_vllm_rollout_func(env_path="my_evals.test_env::test_name")

The public API is what this docstring lists; every other module is internal and may change (docs/architecture.md):

* ``create_openenv_vllm_rollout_func(env_path, ...)`` (alias ``create_rollout_func``) → ``RolloutFunction``, the
  ``rollout_func`` for ``GRPOTrainer``, for an eval with any eval-protocol processor (docs/processors.md), with its
  option objects ``EvalOverrides``, ``VLLMOptions`` and ``RolloutOptions``;
* ``dataset_from_eval(env_path, repeat=1)``: the eval's own input rows as a TRL training dataset;
* ``EvalRolloutWorker(env_path, args=..., processing_class=...)``: the eval as ``AsyncGRPOTrainer``'s rollout worker;
* ``ep_trl.rewards``: ``eval_score``, ``step_reward_sum``, ``step_reward_mean``, ``step_reward_max``;
* ``ep_trl.trainers``: trainers that stand in for TRL's where TRL's cannot run on CPU or drop what a rollout returns
  (``disk_sync``, ``cpu_colocate``, ``cpu_async``, ``disk_weights``, ``images``, ``async_images``: its docstring);
* errors: ``EpTrlError`` and its subclasses ``ConfigError``, ``EnvPathError``, ``UnsupportedEvalError``,
  ``VersionError``, ``GenerationError``, ``NoTrainingSignalError``, ``RolloutWorkerError``, ``ProcessExitingError``;
* ``ep_trl.envs``: the project's own OpenEnv environments (``letters``, ``doors``, ``browsergym``);
* ``ep-trl train ENV_PATH --model MODEL`` and ``ep-trl serve MODEL_DIR``: the command line (``ep_trl.cli``,
  docs/cli.md);
* ``ep_trl.devtools``: development tooling for scripts and tests (tiny models, local servers, demonstrations).

Old paths that the docs once showed users live in ``ep_trl.compat`` until the release it names.
"""

import importlib
from typing import TYPE_CHECKING

from . import compat
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
    from .adapters.async_worker import EvalRolloutWorker
    from .adapters.rollout_func import RolloutFunction, create_openenv_vllm_rollout_func, create_rollout_func
    from .dataset import dataset_from_eval

#: Public names whose modules import eval-protocol, transformers and the rest of the bridge, and the module of each:
#: imported at first use, so that ``import ep_trl`` alone (a shard process, a script's ``--help``) costs no more than
#: the errors and options (tests/project/test_import.py).
_LAZY = {
    "dataset_from_eval": ".dataset",
    "RolloutFunction": ".adapters.rollout_func",
    "create_openenv_vllm_rollout_func": ".adapters.rollout_func",
    "create_rollout_func": ".adapters.rollout_func",
    "EvalRolloutWorker": ".adapters.async_worker",
}


def __getattr__(name: str) -> object:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name], __name__), name)
    globals()[name] = value  # the next lookup finds it without this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


compat.install()
#: The public names, by kind: errors, options and the dataset, the rollout function and worker.
__all__ = ["EpTrlError", "ConfigError", "EnvPathError", "UnsupportedEvalError", "VersionError", "GenerationError"]
__all__ += ["NoTrainingSignalError", "RolloutWorkerError", "ProcessExitingError"]
__all__ += ["EvalOverrides", "VLLMOptions", "RolloutOptions", "dataset_from_eval"]
__all__ += ["create_openenv_vllm_rollout_func", "create_rollout_func", "RolloutFunction", "EvalRolloutWorker"]
__version__ = "0.1.0"
