"""Session fixtures: a tiny local model, a letters env server and one real CPU vLLM server.

The environment variables below are set at import time, before any test module
imports eval_protocol/LiteLLM/TRL: the suite runs offline, and eval-protocol's
store (``~/.eval_protocol``) lives in a per-session temporary HOME. Heavy imports (transformers, openenv-core, which
pulls in gradio) happen inside the fixtures so tests that need neither start fast.
"""

import atexit
import os
import shutil
import tempfile

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
# One OpenMP thread for torch here and in every process the tests start (servers, vLLM, training scripts). On a
# 2-core machine torch's default of two threads stalls whenever another process holds a core: its parallel
# regions wait for a descheduled thread (measured: 40 steps of the tool model took 17.7 s alone and 35.4 s beside
# one CPU-bound process with two threads, 17.1 s and 18.8 s with one; a CPU vLLM engine's 8x32-token batch went
# from 0.13 s to a median 3.7 s). The tiny models lose nothing by it. It must be set before torch starts.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
# eval-protocol writes its log store and event bus under $HOME/.eval_protocol: give the test session its own
# HOME so training rollouts logged by tests (on by default, as for users) never touch the developer's store.
# Playwright finds its browsers under the real home, so pin that first.
os.environ.setdefault("PLAYWRIGHT_BROWSERS_PATH", os.path.join(os.path.expanduser("~"), ".cache", "ms-playwright"))
# uv (OpenEnv's UVProvider, --env-provider uv) keeps the packages it installed from the registry in the user's cache
os.environ.setdefault("UV_CACHE_DIR", os.path.join(os.path.expanduser("~"), ".cache", "uv"))
TEST_HOME = tempfile.mkdtemp(prefix="ep-trl-test-home-")
# ...but the real model's checkpoint stays where scripts/install.sh built it (the user's cache), not rebuilt per session
os.environ.setdefault("EP_TRL_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "ep_trl"))
os.environ["HOME"] = TEST_HOME
atexit.register(shutil.rmtree, TEST_HOME, ignore_errors=True)

from collections.abc import Iterator  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import TYPE_CHECKING  # noqa: E402

import pytest  # noqa: E402

from tests.support.letters import LETTERS_ENV_URL_VAR  # noqa: E402  (light: stdlib only)

#: Fails a module that leaves threads or child processes behind (tests/support/leaks.py); pytester runs that check
#: on modules made for the purpose (tests/support/test_leaks.py).
pytest_plugins = ["tests.support.leaks", "pytester"]

if TYPE_CHECKING:
    from ep_trl.runtime.processes import ServerProcess
    from tests.support.letters import LettersEpisodes


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen2-style model + tokenizer directory (seed 0), built once per session."""
    from ep_trl.devtools.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny_model"), seed=0)


@pytest.fixture(scope="session")
def qwen_template_model_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with TRL's Qwen 2.5 chat template (a tool-call format TRL parses), weights unchanged: for evals
    that offer the model tools."""
    import shutil

    from transformers import AutoTokenizer
    from trl.chat_template_utils import qwen2_5_chat_template

    out = tmp_path_factory.mktemp("qwen_template")
    shutil.copytree(tiny_model_dir, out, dirs_exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(out)
    tokenizer.chat_template = qwen2_5_chat_template
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tiny_vlm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Idefics3 vision-language model + processor directory (seed 0), built once per session."""
    from ep_trl.devtools.tiny_vlm import build_tiny_vlm

    return build_tiny_vlm(tmp_path_factory.mktemp("tiny_vlm"), seed=0)


@pytest.fixture(scope="session")
def sharp_model_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with sharper logits (its final norm scaled), so logprob comparisons mean something; for the
    tests that compare a vLLM engine's logprobs with the trainer's."""
    from tests.support.vllm_server import sharpened_model_copy

    return sharpened_model_copy(tiny_model_dir, tmp_path_factory.mktemp("sharp_model"))


@pytest.fixture(scope="session")
def letters_server_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator["ServerProcess"]:
    """The session's letters env server process (``python -m ep_trl.envs.letters``).

    Started with no LETTERS_* game settings, so defaults apply (vowels, 3 steps,
    no latency); tests choose per episode through reset arguments.
    """
    from tests.support.letters import start_letters_server

    server = start_letters_server(tmp_path_factory.mktemp("letters_logs"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def letters_server(letters_server_process: "ServerProcess") -> Iterator[str]:
    """Base URL of the session's letters server; also exported as ``LETTERS_ENV_URL``."""
    previous = os.environ.get(LETTERS_ENV_URL_VAR)
    os.environ[LETTERS_ENV_URL_VAR] = letters_server_process.base_url
    try:
        yield letters_server_process.base_url
    finally:
        if previous is None:
            os.environ.pop(LETTERS_ENV_URL_VAR, None)
        else:
            os.environ[LETTERS_ENV_URL_VAR] = previous


@pytest.fixture
def letters_episodes(letters_server: str) -> "LettersEpisodes":
    """Callable returning the server's ``GET /episodes`` list (also ``.clear()``, ``.by_id()``).

    The record is cleared first, so a test sees only the episodes it caused.
    """
    from tests.support.letters import LettersEpisodes

    episodes = LettersEpisodes(letters_server)
    episodes.clear()
    return episodes


@pytest.fixture(scope="session")
def shared_vllm_server(sharp_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator["ServerProcess"]:
    """The session's real CPU vLLM server (tests/support/vllm_server.py), started once (35-60 s, ~3 GB) by the first
    test that asks for it and stopped by PID (its whole process group) when the session ends.

    Settings (:data:`tests.support.vllm_server.SHARED_SERVER`): the sharp tiny model, trl vllm-serve's flags and dev
    mode, ``--max-model-len 1024``. The modules that share it (test_vllm_real, test_rollout_worker,
    test_train_letters_script) push their own weights before they generate (a weight sync, or ``vllm_url``'s
    reset); tests take it through :func:`shared_vllm_url`. No test may stop, restart or kill it: fault injection
    uses ``tests/support/faulty_vllm.py``, and a module whose server needs other flags (``--enable-lora``, a vision
    model) starts its own.
    """
    from tests.support.vllm_server import (
        SHARED_SERVER,
        missing_vllm_message,
        start_vllm_server,
        stop_vllm_server,
        vllm_installed,
    )

    if not vllm_installed():
        pytest.fail(missing_vllm_message())
    server = start_vllm_server(sharp_model_dir, tmp_path_factory.mktemp("shared_vllm_logs"), **SHARED_SERVER)
    try:
        yield server
    finally:
        stop_vllm_server(server)


@pytest.fixture
def shared_vllm_url(shared_vllm_server: "ServerProcess") -> str:
    """The shared server's URL, once it is known to be running and not paused: a test that failed between a weight
    sync's ``/pause`` and ``/resume`` must not make every later test hang (the server is resumed, with a warning)."""
    import json
    import urllib.request
    import warnings

    if shared_vllm_server.proc.poll() is not None:
        pytest.fail(
            f"the shared vLLM server (pid {shared_vllm_server.pid}) exited with status "
            f"{shared_vllm_server.proc.returncode}:\n{shared_vllm_server.output_tail()}"
        )
    url = shared_vllm_server.base_url
    with urllib.request.urlopen(f"{url}/is_paused", timeout=30) as resp:  # noqa: S310 - local test URL
        paused = json.loads(resp.read())["is_paused"]
    if paused:
        warnings.warn(f"the shared vLLM server at {url} was left paused by an earlier test; resuming it")
        urllib.request.urlopen(urllib.request.Request(f"{url}/resume", method="POST"), timeout=30).close()  # noqa: S310
    return url
