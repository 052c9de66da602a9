"""The CPU vLLM server for tests: the launcher is ``ep_trl.devtools.cpu_vllm`` (the training scripts and benchmarks
start theirs with it too); what only the tests use stays here (the session's shared server settings, a sharpened
copy of the tiny model, the server's counters)."""

import json
import urllib.request
from pathlib import Path
from typing import Any

from ep_trl.devtools.cpu_vllm import (  # noqa: F401 - the launcher, re-exported for the tests
    missing_vllm_message,
    start_vllm_server,
    stop_vllm_server,
    vllm_installed,
    vllm_server,
)

REPO_ROOT = Path(__file__).resolve().parents[2]

#: The session's shared server (``shared_vllm_server`` in tests/conftest.py), besides its model (the sharp tiny
#: model): trl vllm-serve's flags, and a context of 1024 tokens (the async worker's episodes of up to 256 completion
#: tokens after a prompt; test_vllm_real reads the server's own max_model_len).
SHARED_SERVER: dict[str, Any] = {"max_model_len": 1024, "trl_flags": True}


def generation_tokens_total(base_url: str, timeout_s: float = 10.0) -> float:
    """vLLM's ``vllm:generation_tokens_total`` counter (``GET /metrics``): every token the server has sampled."""
    with urllib.request.urlopen(f"{base_url}/metrics", timeout=timeout_s) as resp:  # noqa: S310 - local test URL
        text = resp.read().decode()
    values = [
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("vllm:generation_tokens_total{")
    ]
    if not values:
        raise RuntimeError(f"{base_url}/metrics has no vllm:generation_tokens_total counter")
    return sum(values)


def served_max_model_len(base_url: str, timeout_s: float = 10.0) -> int:
    """The context length the server reports for its model (``GET /v1/models``, ``max_model_len``)."""
    with urllib.request.urlopen(f"{base_url}/v1/models", timeout=timeout_s) as resp:  # noqa: S310 - local test URL
        return int(json.loads(resp.read())["data"][0]["max_model_len"])


def sharpened_model_copy(model_dir: str | Path, out_dir: str | Path, norm_scale: float = 3.0) -> Path:
    """A copy of a tiny model whose final RMSNorm weight is ``norm_scale`` (all logits scaled by it).

    The project's tiny model has near-uniform next-token distributions (entropy ~6.9 nats over 1000 tokens), so
    every sampled token's logprob is about -6.9 and comparing logprobs cannot tell one position from another.
    With the final norm scaled by 3, sampled tokens' logprobs spread from about -10 to -0.4 nats at
    temperature 0.8, while the episodes of a GRPO group still differ and get different rewards (scale 5-6
    makes the model repeat one token). Only ``model.safetensors`` changes; config and tokenizer are copied.
    """
    import shutil

    from safetensors.torch import load_file, save_file

    src, out = Path(model_dir), Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for item in src.iterdir():
        if item.is_file() and item.name != "model.safetensors":
            shutil.copy2(item, out / item.name)
    tensors = load_file(str(src / "model.safetensors"))
    tensors["model.norm.weight"] = tensors["model.norm.weight"].clone().fill_(norm_scale)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out
