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

from typing import TYPE_CHECKING, Any

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
    from .dataset import dataset_from_eval
    from .rollout import RolloutFunction, create_openenv_vllm_rollout_func, create_rollout_func
    from .rollout_worker import EvalRolloutWorker

#: The public names whose modules import eval-protocol, aiohttp, transformers and the rest of the bridge: imported
#: at their first use (``from ep_trl import X`` or ``ep_trl.X``), so that ``import ep_trl`` alone (a worker process,
#: a script's ``--help``, the errors and options) costs no more than the errors and options (tests/test_import.py).
_LAZY = {"dataset_from_eval": "dataset", "RolloutFunction": "rollout", "create_openenv_vllm_rollout_func": "rollout",
         "create_rollout_func": "rollout", "EvalRolloutWorker": "rollout_worker"}


def __getattr__(name: str) -> Any:
    home = _LAZY.get(name)
    if home == "dataset":
        from . import dataset as module
    elif home == "rollout":
        from . import rollout as module
    elif home == "rollout_worker":
        from . import rollout_worker as module
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(module, name)
    globals()[name] = value  # the next lookup finds it without this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


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
