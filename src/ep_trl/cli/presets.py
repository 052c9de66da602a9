"""The recipes' API: what a training recipe (``recipes/TASK/MODEL.py``, ``train_browsergym_trl.py``) needs to be a
preset of ``ep-trl train``. :mod:`ep_trl.cli` exports these names, and a recipe imports them from there, never from
``ep_trl.cli``'s modules (docs/cli.md, "Recipes are presets"; ``tests/project/test_recipes.py`` holds it).

A recipe is its own flags and defaults plus one call of :func:`run_preset`:

* :class:`Preset`: what a recipe adds to the command (its name, defaults, hooks), :func:`recipe_name` and
  :func:`recipe_command` its name and the command line its run record names;
* :func:`recipe_parser`, :class:`TrainingFlags`, :func:`add_training_flags` and :func:`check_training_flags`: a
  recipe's parser and the flags every recipe has (the eval, the model, GRPO's sizes, the seed, the run folder), with
  the recipe's defaults, and their checks;
* :func:`training_argv`, :func:`preset_defaults` and :func:`env_server_defaults`: a recipe's flags as the command's
  arguments or its defaults;
* :func:`add_generation_flags` and :func:`check_generation_flags`: the generation modes' flags (``ep_trl.cli.modes``);
* :class:`SeedSplit` and :data:`RESET_SEEDS`: the held-out reset seeds a run draws (``ep_trl.cli.heldout``), for a
  recipe that keeps its own instances off them.
"""

import argparse
import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .arguments import Preset
from .heldout import SEEDS, SeedSplit
from .modes import add_generation_flags, check_generation_flags

__all__ = [
    "RESET_SEEDS",
    "Preset",
    "SeedSplit",
    "TrainingFlags",
    "add_generation_flags",
    "add_training_flags",
    "check_generation_flags",
    "check_training_flags",
    "env_server_defaults",
    "preset_defaults",
    "recipe_command",
    "recipe_name",
    "recipe_parser",
    "run_preset",
    "training_argv",
]

#: Reset seeds are drawn from ``range(RESET_SEEDS)`` (:class:`SeedSplit`'s held-out ones and training's).
RESET_SEEDS = SEEDS

#: A recipe's flag (its ``argparse`` dest) -> the ``ep-trl train`` flag (dest) it sets (:func:`preset_defaults`).
COMMON_FLAGS = {
    "env_path": "env_path",
    "model": "model",
    "vllm_base_url": "vllm_server_url",
    "vllm_mode": "vllm_mode",
    "vllm_gpu_memory_utilization": "vllm_gpu_memory_utilization",
    "async_training": "async_training",
    "max_steps": "max_steps",
    "num_generations": "num_generations",
    "learning_rate": "learning_rate",
    "optim": "optim",
    "max_completion_length": "max_completion_length",
    "temperature": "temperature",
    "output_dir": "output_dir",
    "report_to": "report_to",
    "seed": "seed",
}


@dataclass(frozen=True)
class TrainingFlags:
    """A recipe's defaults of the flags every recipe has (:func:`add_training_flags`).

    ``model``: what training starts from without ``--model`` (said in its help); ``micro_batch_size``: adds
    ``--micro-batch-size`` (episodes per forward/backward pass, the rest of ``--batch-size`` as gradient
    accumulation); ``max_completion_length``: adds ``--max-completion-length``; ``result``: adds ``--result``
    (:func:`run_preset` copies ``result.json`` there); ``helps``: a flag's help (by its dest) in place of the
    common one."""

    env_path: str
    model: str
    output_dir: str
    max_steps: int
    num_generations: int
    batch_size: int
    learning_rate: float | None
    temperature: float = 1.0
    micro_batch_size: int | None = None
    max_completion_length: int | None = None
    result: bool = False
    helps: Mapping[str, str] = field(default_factory=dict)


def add_training_flags(parser: argparse.ArgumentParser, defaults: TrainingFlags) -> None:
    """``--env-path``, ``--model``, ``--max-steps``, ``--num-generations``, ``--batch-size`` (and
    ``--micro-batch-size``), ``--learning-rate``, ``--temperature`` (and ``--max-completion-length``), ``--seed``,
    ``--output-dir`` (and ``--result``) with ``defaults``."""
    helps = {
        "env_path": "eval test to train on (module::test or file.py::test)",
        "model": f"model name or path; default: {defaults.model}",
        "max_steps": "optimizer steps",
        "num_generations": "episodes per prompt group (GRPO group size)",
        "batch_size": "episodes per optimizer step",
        "micro_batch_size": "episodes per forward/backward pass (the step's others as gradient accumulation)",
        "learning_rate": "learning rate",
        "temperature": "sampling temperature while training",
        "max_completion_length": "token budget of a whole episode: sampled turns plus the observations between them",
        "seed": "training seed (sampling and data order)",
        "output_dir": "the run folder",
        "result": "also write result.json to this path (e.g. benchmarks/results/...: the checkpoints stay in "
        "--output-dir)",
        **defaults.helps,
    }
    add = parser.add_argument
    add("--env-path", default=defaults.env_path, help=helps["env_path"])
    add("--model", default=None, help=helps["model"])
    add("--max-steps", type=int, default=defaults.max_steps, help=helps["max_steps"])
    add("--num-generations", type=int, default=defaults.num_generations, help=helps["num_generations"])
    add("--batch-size", type=int, default=defaults.batch_size, help=helps["batch_size"])
    if defaults.micro_batch_size is not None:
        add("--micro-batch-size", type=int, default=defaults.micro_batch_size, help=helps["micro_batch_size"])
    add("--learning-rate", type=float, default=defaults.learning_rate, help=helps["learning_rate"])
    add("--temperature", type=float, default=defaults.temperature, help=helps["temperature"])
    if defaults.max_completion_length is not None:
        add(
            "--max-completion-length",
            type=int,
            default=defaults.max_completion_length,
            help=helps["max_completion_length"],
        )
    add("--seed", type=int, default=0, help=helps["seed"])
    add("--output-dir", default=defaults.output_dir, help=helps["output_dir"])
    if defaults.result:
        add("--result", default=None, help=helps["result"])


def check_training_flags(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse, through ``parser.error``, GRPO sizes that do not fit: a ``--batch-size`` that is not a multiple of
    ``--num-generations``, a ``--micro-batch-size`` (where the recipe has it) that does not divide it."""
    if args.batch_size % args.num_generations:
        parser.error(
            f"--batch-size ({args.batch_size}) must be a multiple of --num-generations ({args.num_generations})"
        )
    micro = getattr(args, "micro_batch_size", None)
    if micro is not None and (micro < 1 or args.batch_size % micro):
        parser.error(f"--micro-batch-size ({micro}) must divide --batch-size ({args.batch_size})")


def _batch_sizes(args: argparse.Namespace) -> dict[str, int]:
    """``--batch-size`` (and ``--micro-batch-size``) as the trainer's per-device batch and gradient accumulation."""
    micro = getattr(args, "micro_batch_size", None)
    if micro is None:
        return {"per_device_train_batch_size": args.batch_size}
    return {"per_device_train_batch_size": micro, "gradient_accumulation_steps": args.batch_size // micro}


def training_argv(args: argparse.Namespace) -> list[str]:
    """The ``ep-trl train`` arguments of :func:`add_training_flags`' flags (``--model`` and ``--result`` aside: the
    recipe says its model, and :func:`run_preset` copies the result): ENV_PATH first."""
    values: dict[str, object] = {
        "max_steps": args.max_steps,
        "num_generations": args.num_generations,
        **_batch_sizes(args),
        "learning_rate": args.learning_rate,
        "temperature": args.temperature,
        "max_completion_length": getattr(args, "max_completion_length", None),
        "seed": args.seed,
        "output_dir": args.output_dir,
    }
    argv = [args.env_path]
    for name, value in values.items():
        if value is not None:
            argv += [f"--{name.replace('_', '-')}", str(value)]
    return argv


def preset_defaults(args: argparse.Namespace, **extra: object) -> dict[str, object]:
    """``ep-trl train``'s defaults from a recipe's parsed ``args`` (the flags of :data:`COMMON_FLAGS` it has, those
    left unset omitted; ``--batch-size`` and ``--micro-batch-size`` as :func:`training_argv` reads them) and
    ``extra``."""
    values: dict[str, object] = {
        flag: getattr(args, name) for name, flag in COMMON_FLAGS.items() if getattr(args, name, None) is not None
    }
    return {**values, **_batch_sizes(args), **extra}


def env_server_defaults(
    args: argparse.Namespace, env_module: str, env_url_var: str, **extra: object
) -> dict[str, object]:
    """:func:`preset_defaults`, and the environment server: with no ``--env-url`` the run starts ``python -m
    env_module`` as its ``--env-server`` and exports its URL in ``env_url_var``, with one it exports that URL."""
    values = preset_defaults(args)
    if args.env_url is None:
        values.update(env_server=f"python -m {env_module} --host 127.0.0.1 --port {{port}}", env_url_var=env_url_var)
    else:
        os.environ[env_url_var] = args.env_url
    return {**values, **extra}


def recipe_name(file: str) -> str:
    """A recipe's name in its ``--help`` and its plot: ``recipes/TASK/MODEL.py`` for one there, else its file name."""
    path = Path(file)
    return "/".join(path.parts[-3:]) if path.parent.parent.name == "recipes" else path.name


def recipe_parser(file: str, doc: str | None) -> argparse.ArgumentParser:
    """A recipe's parser: named :func:`recipe_name`, its docstring ``doc`` as the description, kept as written."""
    return argparse.ArgumentParser(
        prog=recipe_name(file), description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )


def recipe_command(file: str, argv: Sequence[str] | None = None) -> list[str]:
    """The command line a recipe's run record names: the interpreter, the recipe ``file`` (its ``__file__``) and its
    arguments (``argv``, or ``sys.argv[1:]`` when None). The record names the commit of the checkout that holds
    ``file``."""
    return [sys.executable, file, *(sys.argv[1:] if argv is None else argv)]


def run_preset(
    preset: Preset, argv: Sequence[str] = (), *, output_dir: str | None = None, result: str | None = None
) -> int:
    """``ep-trl train ARGV`` as ``preset`` (:func:`ep_trl.cli.train.main`): its exit status (0 when training ended, 2
    for bad input, 130 after Ctrl-C). With ``result`` (a recipe's ``--result``) and a run that ended with 0,
    ``output_dir``'s ``result.json`` is copied there."""
    from .train import main

    status = main(list(argv), preset)
    if status == 0 and result:
        if output_dir is None:
            raise ValueError("run_preset(result=...) needs output_dir, the run folder that holds result.json")
        Path(result).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(Path(output_dir) / "result.json", result)
        print(f"result copied to {result}", flush=True)
    return status
