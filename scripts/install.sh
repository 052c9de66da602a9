#!/usr/bin/env bash
# Install ep_trl with its test dependencies into the current Python (idempotent).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# A CPU build of torch first: left to resolve `torch` alone, pip picks the newest CUDA build (several GB).
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
if ! "$PY" -c "import torch" 2>/dev/null; then
  "$PY" -m pip install -q "$TORCH_SPEC"
fi
"$PY" -m pip install -q -e ".[test]"
"$PY" -c "import ep_trl, torch, trl, eval_protocol; print(f'ep_trl {ep_trl.__version__}: torch {torch.__version__}, trl {trl.__version__}')"
