"""What the training scripts (``recipes/letters/tiny.py``, ``train_browsergym_trl.py``,
``recipes/sentiment/smollm2.py``) share as presets of ``ep-trl train``: their common flags as the command's defaults,
so that each script is its own flags and defaults plus one call of :func:`ep_trl.cli.train.main`.
(``recipes/doors/smollm2.py`` and ``recipes/miniwob/smollm2.py`` build the command's arguments themselves.)"""

import argparse
import os

#: A script's flag (its ``argparse`` dest) -> the ``ep-trl train`` flag (dest) it sets.
COMMON_FLAGS = {
    "env_path": "env_path",
    "model": "model",
    "vllm_base_url": "vllm_server_url",
    "vllm_mode": "vllm_mode",
    "vllm_gpu_memory_utilization": "vllm_gpu_memory_utilization",
    "async_training": "async_training",
    "max_steps": "max_steps",
    "num_generations": "num_generations",
    "batch_size": "per_device_train_batch_size",
    "learning_rate": "learning_rate",
    "optim": "optim",
    "max_completion_length": "max_completion_length",
    "temperature": "temperature",
    "output_dir": "output_dir",
    "report_to": "report_to",
    "seed": "seed",
}


def common_defaults(args: argparse.Namespace, **extra: object) -> dict[str, object]:
    """``ep-trl train``'s defaults from a script's parsed ``args`` (the flags of :data:`COMMON_FLAGS` it has, those
    left unset omitted) and ``extra``."""
    values: dict[str, object] = {
        flag: getattr(args, name) for name, flag in COMMON_FLAGS.items() if getattr(args, name, None) is not None
    }
    return {**values, **extra}


def script_defaults(args: argparse.Namespace, env_module: str, env_url_var: str, **extra: object) -> dict[str, object]:
    """:func:`common_defaults`, and the environment server: with no ``--env-url`` the run starts ``python -m
    env_module`` as its ``--env-server`` and exports its URL in ``env_url_var``, with one it exports that URL."""
    values = common_defaults(args)
    if args.env_url is None:
        values.update(env_server=f"python -m {env_module} --host 127.0.0.1 --port {{port}}", env_url_var=env_url_var)
    else:
        os.environ[env_url_var] = args.env_url
    return {**values, **extra}
