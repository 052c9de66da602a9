"""The checks ``ep-trl train`` makes of the vLLM server before anything heavy starts: the one a run starts itself
(``--vllm-server-url local``: vLLM's CPU build, a context that holds the longest prompt and the completion) and one
that must already answer (``--vllm-server-url URL``: it answers, and serves the run's model)."""

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from .. import VLLMOptions
from . import modes
from .arguments import LOCAL_PROMPT_MARGIN


def check_local_server(
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


def check_server(parser: argparse.ArgumentParser, url: str, model: str | None, vllm: VLLMOptions) -> str:
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
