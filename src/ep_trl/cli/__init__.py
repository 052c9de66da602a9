"""``ep-trl``: the command line of ep_trl (``[project.scripts]`` in ``pyproject.toml``; ``python -m ep_trl.cli`` runs
the same command, docs/cli.md), and the public API of its presets, the training recipes (``recipes/``,
``train_browsergym_trl.py``): ``Preset``, ``run_preset`` and the helpers of ``ep_trl.cli.presets``, exported here
(docs/cli.md, "Recipes are presets"). A recipe imports these names from ``ep_trl.cli``, never from its modules.

* ``train``: ``ep-trl train ENV_PATH --model MODEL [flags]``, GRPO on an eval-protocol eval: its parser and plan;
* ``checks``: the checks made before anything heavy starts (flags, mode, model, eval, template, processes);
* ``server_checks``: the checks of the vLLM server (the run's own, or one that must answer);
* ``rows``: the rows a run trains on and holds out, and the held-out checks;
* ``job``: a planned run carried out, its run folder written however it ends;
* ``ranks``: the processes of a run under ``torchrun`` or ``accelerate launch``, and what the main one shares;
* ``run_result``: the run's closing summary, plot and ``result.json``;
* ``arguments``: ``ep-trl train``'s option groups, what a preset adds, and the planned run;
* ``serve``: ``ep-trl serve MODEL_DIR``, a local model behind the endpoint training uses, to run the eval under pytest;
* ``modes``: the generation modes (flags, refused combinations, config and trainer per mode);
* ``env_server``: ``--env-server``, a local environment server started and stopped with the run;
* ``replicas``: ``--env-replicas``, copies of that server, watched and started again when one dies;
* ``heldout``: ``--held-out``, held-out rows or reset seeds played greedily before and after training;
* ``heldout_figures``: what a held-out play measured, and the lines that print it;
* ``warm_start``: ``--warm-start``, a supervised fine-tune on demonstrations before GRPO;
* ``demonstrations``: the demonstrations file read and checked, line by line;
* ``time_budget``: ``--time-budget-s``, no step starts that would end past the budget;
* ``progress``: the per-step line with its bar and ETA, and the closing summary;
* ``reward_curve``: the eval's score per optimizer step, and its plot;
* ``run_folder``: the run folder (resolved config, metrics per step, result with its run record);
* ``presets``: the recipes' API: a preset run, the flags every recipe has, as the command's arguments or defaults.
"""

import importlib
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .presets import (
        RESET_SEEDS,
        Preset,
        SeedSplit,
        TrainingFlags,
        add_generation_flags,
        add_training_flags,
        check_generation_flags,
        check_training_flags,
        env_server_defaults,
        preset_defaults,
        recipe_command,
        recipe_name,
        recipe_parser,
        run_preset,
        training_argv,
    )

#: The recipes' API (``ep_trl.cli.presets``), imported at first use: ``ep-trl --help`` imports none of it.
__all__ = [
    "COMMANDS",
    "Preset",
    "RESET_SEEDS",
    "SeedSplit",
    "TrainingFlags",
    "add_generation_flags",
    "add_training_flags",
    "check_generation_flags",
    "check_training_flags",
    "env_server_defaults",
    "main",
    "preset_defaults",
    "recipe_command",
    "recipe_name",
    "recipe_parser",
    "run_preset",
    "training_argv",
]
_PRESET_NAMES = frozenset(__all__) - {"COMMANDS", "main"}

COMMANDS = {
    "train": "GRPO on an eval-protocol eval: ep-trl train ENV_PATH --model MODEL [flags] (--help lists them)",
    "serve": "serve a local model behind the endpoint training uses: ep-trl serve MODEL_DIR [--port P]",
}
USAGE = "usage: ep-trl {train,serve} ...\n\n" + "\n".join(f"  {name:6} {what}" for name, what in COMMANDS.items())


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``ep-trl COMMAND ...``; the command's exit status (2 and the usage for an unknown command)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command == "train":
        from .train import main as train

        try:
            return train(rest)
        except KeyboardInterrupt:  # Ctrl-C: the run folder and the message are written; the shell's status for it
            return 130
    if command == "serve":
        from .serve import main as serve

        return serve(rest)
    print(f"ep-trl: unknown command {command!r}\n{USAGE}", file=sys.stderr)
    return 2


def __getattr__(name: str) -> object:
    if name not in _PRESET_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(".presets", __name__), name)
    globals()[name] = value  # the next lookup finds it without this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PRESET_NAMES))
