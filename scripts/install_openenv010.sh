#!/usr/bin/env bash
# Install ep_trl next to OpenEnv's `openenv` 0.10 distribution, in its own virtual environment, so the
# OpenEnv-facing tests also run against it (scripts/test_openenv010.sh). The project's Python keeps
# `openenv-core` 0.3 (scripts/install.sh): the two distributions write the same `openenv` package, so they
# never share an environment.
#
#   scripts/install_openenv010.sh          # venv at <repo>/.venv-openenv010
#
# The order is a user's: openenv==0.10.0 first, then `pip install -e ".[test,openenv]"`, which must leave
# it alone (checked at the end: openenv still 0.10.0 with its own files, openenv-core absent).
#
# Speed: torch comes first through pip (pip's configuration finds the local CPU wheel, as in scripts/install.sh);
# then uv (from PyPI, into the venv) installs openenv and ep_trl's other requirements, read from pyproject.toml;
# the last step is still plain pip installing ep_trl, as a user would, with everything already satisfied.
# Measured on 2 cores from nothing: ~55 s in all (uv's steps ~15 s); with pip alone (OPENENV010_USE_UV=0, also
# the fallback when uv cannot be installed) ~95 s. A second run that finds the venv complete: ~5 s.
#
# Environment:
#   OPENENV010_VENV     venv path (relative paths are relative to the repo root). Default: .venv-openenv010
#   OPENENV_VERSION     openenv version installed first. Default: 0.10.0
#   OPENENV010_PYTHON   interpreter used to create the venv. Default: python3
#   TORCH_SPEC          torch requirement installed first, as in scripts/install.sh. Default: torch==2.13.0
#                       (pip's configuration on this kind of machine finds the CPU wheel in /opt/wheels;
#                       elsewhere PyPI's build is used)
#   OPENENV010_USE_UV   set to 0 to install with pip alone. Default: 1
#   UV_VERSION          uv version used for the bulk install. Default: 0.13.9
#   OPENENV010_FORCE_REINSTALL  set to 1 to delete the venv and install it anew.
#
# Idempotent: if the venv has the wanted openenv, no openenv-core, imports ep_trl from this checkout and was
# installed from the current pyproject.toml, it does nothing; otherwise each step installs only what is missing
# (a venv where openenv-core got installed is deleted and made anew: its openenv files were overwritten).
set -euo pipefail

start_s=$(date +%s)
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${OPENENV010_VENV:-.venv-openenv010}"
case "$venv" in
  /*) ;;
  *) venv="$repo_root/$venv" ;;
esac
openenv_version="${OPENENV_VERSION:-0.10.0}"
python_bin="${OPENENV010_PYTHON:-python3}"
torch_spec="${TORCH_SPEC:-torch==2.13.0}"
use_uv="${OPENENV010_USE_UV:-1}"
uv_version="${UV_VERSION:-0.13.9}"
stamp="$venv/.ep_trl-pyproject.sha256"   # pyproject.toml's hash when ep_trl was last installed here

log() { printf '[install_openenv010 +%ss] %s\n' "$(( $(date +%s) - start_s ))" "$*" >&2; }
# pip's configuration on some machines names local index folders that lack most projects: drop that noise.
quiet() { "$@" 2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2); }
finish() { log "done in $(( $(date +%s) - start_s )) s (venv: $venv)"; }
pyproject_hash() { sha256sum "$repo_root/pyproject.toml" | cut -d' ' -f1; }

# openenv at the wanted version, openenv-core absent, ep_trl importable from this checkout.
venv_state_ok() {
  [[ -x "$venv/bin/python" ]] || return 1
  "$venv/bin/python" - "$openenv_version" "$repo_root" <<'PY'
import importlib.metadata as md
import sys
from pathlib import Path

want, repo = sys.argv[1], Path(sys.argv[2]).resolve()
problems = []
try:
    have = md.version("openenv")
    if have != want:
        problems.append(f"openenv {have} installed, want {want}")
except md.PackageNotFoundError:
    problems.append("openenv is not installed")
try:
    problems.append(f"openenv-core {md.version('openenv-core')} is installed (it overwrites openenv's files)")
except md.PackageNotFoundError:
    pass
try:
    import ep_trl

    where = Path(ep_trl.__file__).resolve()
    if repo not in where.parents:
        problems.append(f"ep_trl imports from {where}, not from {repo}")
except Exception as exc:  # noqa: BLE001 - any import failure means: reinstall
    problems.append(f"import ep_trl failed: {exc!r}")
for problem in problems:
    print(f"[install_openenv010]   {problem}", file=sys.stderr)
sys.exit(1 if problems else 0)
PY
}

if [[ "${OPENENV010_FORCE_REINSTALL:-0}" == "1" ]]; then
  log "OPENENV010_FORCE_REINSTALL=1: deleting $venv"
  rm -rf "$venv"
elif venv_state_ok 2>/dev/null && [[ -f "$stamp" && "$(cat "$stamp")" == "$(pyproject_hash)" ]]; then
  log "openenv==$openenv_version and ep_trl (current pyproject.toml) already installed in $venv; nothing to do"
  finish
  exit 0
elif [[ -x "$venv/bin/python" ]] && "$venv/bin/python" -m pip show openenv-core >/dev/null 2>&1; then
  log "openenv-core is installed in $venv (openenv's files are overwritten): deleting the venv"
  rm -rf "$venv"
fi

if [[ ! -x "$venv/bin/python" ]]; then
  log "creating venv $venv with $("$python_bin" --version 2>&1)"
  "$python_bin" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip)

# 1. A CPU torch first, through pip and its configuration, as scripts/install.sh does: left to resolve `torch`
#    alone, a resolver picks the newest CUDA build (several GB).
if "$venv/bin/python" -c "import torch" 2>/dev/null; then
  log "torch already installed"
else
  log "installing $torch_spec (pip)"
  quiet "${pip[@]}" install --quiet --no-compile "$torch_spec"   # bytecode is compiled on import, as uv leaves it
fi

# 2. What a user of openenv 0.10 already has (openenv itself), then ep_trl's other requirements, both with uv
#    (torch, installed above, satisfies `torch>=2.4`, so uv leaves it).
if [[ "$use_uv" == "1" ]]; then
  if quiet "${pip[@]}" install --quiet "uv==$uv_version"; then
    uv=("$venv/bin/uv" pip install --quiet --python "$venv/bin/python")
    log "installing openenv==$openenv_version (uv $uv_version)"
    "${uv[@]}" "openenv==$openenv_version"
    log "installing ep_trl's requirements from pyproject.toml, extras test+openenv (uv)"
    "${uv[@]}" -r "$repo_root/pyproject.toml" --extra test --extra openenv
  else
    log "could not install uv==$uv_version; pip installs everything (slower)"
  fi
fi
if [[ "$("$venv/bin/python" -c "import importlib.metadata as m
try:
    print(m.version('openenv'))
except m.PackageNotFoundError:
    print('')")" != "$openenv_version" ]]; then
  log "installing openenv==$openenv_version (pip)"
  quiet "${pip[@]}" install --quiet "openenv==$openenv_version"
fi

# 3. ep_trl itself, with the extra that names this distribution, as a user installs it: plain pip. It must not
#    pull openenv-core.
log "installing ep_trl: pip install -e \".[test,openenv]\""
quiet "${pip[@]}" install --quiet -e "$repo_root[test,openenv]"

# 4. Verify: openenv untouched, openenv-core absent, ep_trl importable.
log "verifying"
"${pip[@]}" show openenv | sed -n '1,2p' >&2
if "${pip[@]}" show openenv-core >/dev/null 2>&1; then
  log "ERROR: openenv-core got installed into $venv; it overwrites openenv $openenv_version's files"
  exit 1
fi
log "pip show openenv-core: not installed (as it should be)"
if ! venv_state_ok; then
  log "ERROR: verification failed for $venv"
  exit 1
fi
"$venv/bin/python" -c "import importlib.metadata as m, ep_trl, openenv.core, torch, trl; print(f'[install_openenv010] import ep_trl OK: openenv {m.version(\"openenv\")}, torch {torch.__version__}, trl {trl.__version__}')" >&2
pyproject_hash >"$stamp"
finish
