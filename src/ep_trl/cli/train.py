"""``ep-trl train ENV_PATH --model MODEL [flags]``: GRPO on an eval-protocol eval, from one command.

The dataset is the eval's own rows (``dataset_from_eval``), the reward is the eval's score (``eval_score``), and the
episodes come from the bridge (``create_openenv_vllm_rollout_func``, or ``EvalRolloutWorker`` with ``--async``).
Every ``GRPOConfig`` field is a flag and a YAML ``--config`` file sets any of them, through TRL's own parser
(``trl.TrlParser``, as ``trl grpo``); ep_trl's own options are flags in their own groups of ``--help``.

Every bad input is refused before anything heavy starts (no model loaded, no server started), with a message naming
the fix: an ENV_PATH that names no eval, an eval whose processor cannot train, modes that do not go together, a
model path that is not a model, a vLLM server that does not answer or serves another model.

The training recipes are presets of this command: they fill its defaults or arguments and hooks
(:class:`~ep_trl.cli.arguments.Preset`) and call :func:`main` through ``ep_trl.cli.run_preset`` (the presets' API,
:mod:`ep_trl.cli.presets`). This module parses the command line and plans the run;
the option groups and the planned run are in :mod:`ep_trl.cli.arguments`, the checks in :mod:`ep_trl.cli.checks`
and :mod:`ep_trl.cli.rows`, and the run itself in :mod:`ep_trl.cli.job`.
"""

import argparse
import os
import shlex
import sys
from collections.abc import Sequence
from dataclasses import fields
from typing import TYPE_CHECKING, TypeVar

from . import checks, modes, rows, server_checks
from .arguments import (
    DESCRIPTION,
    LOCAL_PROMPT_MARGIN,
    OPTION_GROUPS,
    PROG,
    TRAIN_DEFAULTS,
    EvalArguments,
    GenerationArguments,
    Preset,
    RolloutArguments,
    RunArguments,
    TrainJob,
    VLLMArguments,
)
from .job import run

if TYPE_CHECKING:
    from _typeshed import DataclassInstance
    from trl import TrlParser

    from ..trajectory.types import Settings

__all__ = ["LOCAL_PROMPT_MARGIN", "OPTION_GROUPS", "PROG", "Preset", "TrainJob", "main", "make_parser", "plan", "run"]

_Group = TypeVar("_Group", bound="DataclassInstance")

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # the rollout_func and async trainer are experimental in TRL
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network fetch of LiteLLM's price list


def make_parser(preset: Preset | None = None) -> "TrlParser":
    """``trl.TrlParser`` over ep_trl's option groups and ``GRPOConfig``, with ENV_PATH, the command-line defaults
    (:data:`TRAIN_DEFAULTS`) and the preset's."""
    from transformers.hf_argparser import DataClassType
    from trl import GRPOConfig, TrlParser

    class TrainParser(TrlParser):
        """TRL's parser (``--config`` YAML, its ``env`` block, every dataclass field a flag) whose parse keeps the
        values as given: the generation mode decides the trainer config's class (``AsyncGRPOConfig`` with
        ``--async``) and some of its fields, so the config is built once the mode is known."""

        # returns the namespace, not dataclasses: the mode decides the config's class (see above)
        def parse_args_into_dataclasses(  # type: ignore[override]
            self, args: Sequence[str] | None = None, return_remaining_strings: bool = False, **kwargs: object
        ) -> tuple[argparse.Namespace] | tuple[argparse.Namespace, list[str]]:
            namespace, remaining = self.parse_known_args(args=args)
            if remaining and not return_remaining_strings:
                self.error(f"unrecognized arguments: {' '.join(remaining)}")
            return (namespace, remaining) if return_remaining_strings else (namespace,)

    class TRLFlags(GRPOConfig):
        """``GRPOConfig``'s fields, in a group of their own in ``--help``."""

        _argument_group_name = "TRL: GRPOConfig (every field is a flag; TRL's documentation describes them)"

    preset = preset or Preset(prog=PROG, title="")
    parser = TrainParser(
        [DataClassType(cls) for cls in (*OPTION_GROUPS, TRLFlags)],
        prog=preset.prog,
        description=DESCRIPTION,
        usage=f"{preset.prog} ENV_PATH --model MODEL [--config YAML] [flags]",
        epilog="Examples and every ep_trl flag: docs/cli.md.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "env_path",
        metavar="ENV_PATH",
        nargs="?",
        default=None,
        help="the eval to train on: path/to/eval.py::test_name or package.module::test_name",
    )
    parser.add_argument(
        "--config",
        metavar="YAML",
        default=None,
        help="a YAML file of flag values (`flag_name: value`, and an `env:` mapping of environment "
        "variables), as `trl grpo --config`; flags given on the command line win",
    )
    parser.set_defaults_with_config(**{**TRAIN_DEFAULTS, **preset.defaults})
    return parser


def main(argv: Sequence[str] | None = None, preset: Preset | None = None) -> int:
    """``ep-trl train``'s arguments (without ``train``) to an exit status: 0 when training ended, 2 for bad input
    (argparse's status), 130 after Ctrl-C, 143 after SIGTERM (raised as ``ep_trl.runtime.shutdown.Terminated``)."""
    from .progress import quiet_library_output

    argv = list(sys.argv[1:] if argv is None else argv)
    preset = preset or Preset(prog=PROG, title="")
    quiet_library_output()  # before the eval's import: eval-protocol warns at import
    parser = make_parser(preset)
    try:
        (namespace,) = parser.parse_args_and_config(argv)
    except (OSError, ValueError) as error:  # a --config file that cannot be read, or holds unknown keys
        parser.error(f"--config: {error}")
    job = plan(parser, vars(namespace), preset, argv)
    return run(job)


def plan(parser: argparse.ArgumentParser, values: "Settings", preset: Preset, argv: Sequence[str]) -> TrainJob:
    """Check every input and decide the run, before anything heavy starts; ``parser.error`` (exit status 2, the
    message naming the fix) for bad input."""
    from trl import GRPOConfig

    values = dict(values)
    env_path = values.pop("env_path")
    values.pop("config", None)  # read by TrlParser already
    run_args, gen = _group(RunArguments, values), _group(GenerationArguments, values)
    evals, rollout, vllm_args = (
        _group(EvalArguments, values),
        _group(RolloutArguments, values),
        _group(VLLMArguments, values),
    )
    grpo_fields = {f.name for f in fields(GRPOConfig) if f.init}
    trl_values = {k: v for k, v in values.items() if k in grpo_fields}
    if not env_path:
        parser.error(
            "ENV_PATH is required: the eval to train on, e.g. `ep-trl train evals/eval_letters.py::"
            "test_letters --model MODEL` (path/to/eval.py::test_name or package.module::test_name)"
        )
    if not run_args.model and preset.start_model is None:
        parser.error(
            "--model is required: a Hugging Face model directory or hub id, e.g. --model Qwen/Qwen2.5-0.5B-Instruct"
        )
    checks.check_trl_mode_flags(parser, trl_values)
    checks.check_report_to(parser, trl_values.get("report_to"))
    mode = checks.generation_mode(parser, gen, run_args, trl_values)
    checks.check_processes(parser, trl_values, mode, run_args.env_server)
    if run_args.model:
        run_args.model = checks.package_model(parser, run_args.model)
        checks.check_model(parser, run_args.model)
    checks.check_env_server(parser, run_args, evals.env_base_url)
    spec, offered = checks.check_eval(parser, env_path, checks.absolute_paths(evals.input_dataset))
    checks.check_env_provider(parser, run_args, evals.env_base_url, spec)
    template = checks.check_chat_template(parser, run_args, offered, env_path)
    overrides, options, vllm, concurrent = checks.bridge_options(
        parser, evals, rollout, vllm_args, trl_values.get("chat_template_kwargs"), run_args.env_url_var
    )
    row_count = rows.check_rows(parser, env_path, overrides.input_dataset)
    training_tasks = rows.check_held_out(parser, run_args, spec, overrides, row_count)
    variants = rows.check_held_out_variants(parser, run_args, spec, overrides)
    demonstrations = checks.check_warm_start(parser, run_args, mode, options, template)
    local_len = None
    if mode.vllm_base_url == modes.LOCAL_SERVER:
        local_len = server_checks.check_local_server(
            parser,
            env_path,
            run_args.model,
            gen.vllm_max_model_len,
            mode,
            int(trl_values["max_completion_length"]),
            overrides.input_dataset,
        )
    else:
        for flag, value in (
            ("--vllm-max-model-len", gen.vllm_max_model_len),
            ("--vllm-server-args", gen.vllm_server_args),
        ):
            if value is not None:
                parser.error(
                    f"{flag} is for the vLLM server the run starts itself: add --vllm-server-url local, or "
                    f"drop {flag} (a server you start takes its arguments on its own command line)"
                )
    served = (
        server_checks.check_server(parser, mode.vllm_base_url, run_args.model, vllm)
        if mode.vllm_base_url and not local_len
        else None
    )
    if trl_values.get("bf16") is None:
        trl_values["bf16"] = mode.on_gpu
    return TrainJob(
        env_path=env_path,
        model=run_args.model,
        mode=mode,
        config_values=trl_values,
        run=run_args,
        overrides=overrides,
        options=options,
        vllm=vllm,
        max_concurrent_rollouts=concurrent,
        command=list(preset.command or [*preset.prog.split(), *argv]),
        preset=preset,
        served_model=served,
        chat_template=template,
        tools_offered=offered,
        openenv=spec.processor is None,
        training_tasks=training_tasks,
        held_out_variants=variants,
        local_max_model_len=local_len,
        local_server_args=shlex.split(gen.vllm_server_args or ""),
        demonstrations=demonstrations,
    )


def _group(cls: type[_Group], values: dict[str, object]) -> _Group:
    """One option group's dataclass from the parsed values, its fields taken out of ``values``."""
    return cls(**{f.name: values.pop(f.name) for f in fields(cls)})
