"""ep_trl: an eval-protocol ``@evaluation_test`` as a token-exact TRL GRPO ``rollout_func``.

>>> from ep_trl import create_openenv_vllm_rollout_func
>>> from ep_trl.rewards import eval_score
>>> rollout_func = create_openenv_vllm_rollout_func(env_path="my_evals.test_env::test_name")
"""

from .dataset import dataset_from_eval
from .errors import ConfigError, EnvPathError, EpTrlError, GenerationError, UnsupportedEvalError, VersionError
from .rollout import RolloutFunction, create_openenv_vllm_rollout_func

__all__ = [
    "ConfigError",
    "EnvPathError",
    "EpTrlError",
    "GenerationError",
    "RolloutFunction",
    "UnsupportedEvalError",
    "VersionError",
    "create_openenv_vllm_rollout_func",
    "dataset_from_eval",
]
__version__ = "0.1.0"
