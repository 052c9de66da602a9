"""Pieces shared by the training scripts: progress lines, a local environment server, a tiny default model.

This is command-line output, so it prints; the library itself only logs.
"""

import contextlib
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from .. import shutdown
from ..processes import free_port, start_server


class ProgressPrinter(TrainerCallback):
    """One line per optimizer step: reward, eval score, episodes/s and the time left."""

    def __init__(self, stream: Any = None) -> None:
        self._stream = stream or sys.stdout
        self._started = time.monotonic()

    def on_train_begin(self, args, state, control, **kwargs):
        self._started = time.monotonic()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or "reward" not in logs:
            return
        step, total = state.global_step, state.max_steps
        elapsed = time.monotonic() - self._started
        eta = elapsed / step * (total - step) if step else float("nan")
        score = logs.get("rewards/eval_score/mean")
        parts = [
            f"step {step}/{total}",
            f"reward {logs['reward']:.4f} (std {logs.get('reward_std', float('nan')):.4f})",
            f"eval_score {score:.4f}" if score is not None else None,
            f"episodes/s {logs['ep_trl/episodes_per_s']:.2f}" if "ep_trl/episodes_per_s" in logs else None,
            f"failed {logs['ep_trl/failed_fraction']:.0%}" if "ep_trl/failed_fraction" in logs else None,
            f"turns {logs['ep_trl/mean_turns']:.1f}" if "ep_trl/mean_turns" in logs else None,
            f"ETA {eta:.0f}s",
        ]
        print(" | ".join(p for p in parts if p), file=self._stream, flush=True)


@contextlib.contextmanager
def local_env_server(module: str, *, env: Mapping[str, str] | None = None, port: int | None = None,
                     timeout_s: float = 120.0) -> Iterator[str]:
    """Run ``python -m <module> --host 127.0.0.1 --port P`` for the duration of the block; yield its URL.

    The server is stopped (with its whole process group) on normal exit, on an exception, on Ctrl-C and on
    SIGTERM (``ep_trl.shutdown``), and by its watchdog if the script is killed, so a training script never leaves an
    environment process behind.
    """
    port = port or free_port()
    log_dir = Path(tempfile.mkdtemp(prefix="ep-trl-env-"))
    cmd = [sys.executable, "-m", module, "--host", "127.0.0.1", "--port", str(port)]
    shutdown.handle_sigterm()
    server = start_server(module, cmd, port=port, log_dir=log_dir, env=env, timeout_s=timeout_s)
    try:
        yield server.base_url
    finally:
        server.stop()
