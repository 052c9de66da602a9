"""Tests of TRL's colocated vLLM engine (``vllm_mode="colocate"``): they need vLLM in the trainer's own Python, so
they run in ``.venv-colocate`` (``bash scripts/install_colocate.sh && bash scripts/test_colocate.sh``, part of the
README's test command and of CI). The project's Python has no vLLM: there these modules are not collected."""

import importlib.util

collect_ignore_glob = [] if importlib.util.find_spec("vllm") is not None else ["test_*.py"]
