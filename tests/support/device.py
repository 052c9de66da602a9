"""Where the tests' trainers and reference models run: the CPU unless ``EP_TRL_TEST_DEVICE=cuda`` (set by
``scripts/test_gpu.sh``) puts them on the GPU. Generation servers are not affected: vLLM's CPU build stays on the
CPU."""

import os

#: The environment variable that picks the device: ``cpu`` (default) or ``cuda``.
DEVICE_VARIABLE = "EP_TRL_TEST_DEVICE"
DEVICES = ("cpu", "cuda")


def device_under_test() -> str:
    """``cpu`` or ``cuda``, from :data:`DEVICE_VARIABLE`; ``cuda`` without a GPU is an error, never a quiet CPU run."""
    device = os.environ.get(DEVICE_VARIABLE, "cpu").strip().lower() or "cpu"
    if device not in DEVICES:
        raise ValueError(f"{DEVICE_VARIABLE}={device!r}: use one of {DEVICES}")
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError(f"{DEVICE_VARIABLE}=cuda, but torch sees no GPU (torch {torch.__version__})")
    return device


def trainer_on_cpu() -> bool:
    """The value of a test trainer's ``use_cpu``."""
    return device_under_test() == "cpu"
