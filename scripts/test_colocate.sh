#!/usr/bin/env bash
# Run the tests of TRL's colocated vLLM engine (tests/colocate) in the venv made by scripts/install_colocate.sh:
# they need vLLM importable in the trainer's own Python, which the project's Python does not have.
#
#   scripts/test_colocate.sh           # tests/colocate
#   scripts/test_colocate.sh -x -k letters
#
# Environment:
#   COLOCATE_VENV   venv path (relative paths are relative to the repo root). Default: .venv-colocate
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
venv="${COLOCATE_VENV:-.venv-colocate}"
case "$venv" in
  /*) ;;
  *) venv="$repo_root/$venv" ;;
esac
if [[ ! -x "$venv/bin/python" ]]; then
  printf '[test_colocate] %s does not exist: run `bash scripts/install_colocate.sh` first.\n' "$venv" >&2
  exit 1
fi
exec "$venv/bin/python" -m pytest -q tests/colocate "$@"
