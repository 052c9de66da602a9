#!/usr/bin/env bash
# Run the OpenEnv-facing tests against OpenEnv's `openenv` 0.10 distribution, in the venv made by
# scripts/install_openenv010.sh (the project's Python has `openenv-core` 0.3; the two never share a venv).
#
#   scripts/test_openenv010.sh                 # the list below
#   scripts/test_openenv010.sh -x -k letters   # extra pytest arguments are passed on
#
# Environment:
#   OPENENV010_VENV   venv path (relative paths are relative to the repo root). Default: .venv-openenv010
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
venv="${OPENENV010_VENV:-.venv-openenv010}"
case "$venv" in
  /*) ;;
  *) venv="$repo_root/$venv" ;;
esac

# The tests that create, serve or drive OpenEnv environments and clients.
TESTS=(
  tests/openenv/test_client.py
  tests/envs/test_letters.py
  tests/envs/test_doors.py
  tests/adapters/test_rollout_func.py
  tests/adapters/test_training.py
  tests/openenv/test_loop.py
  tests/openenv/test_servers.py
  tests/project/test_import.py::test_import_ep_trl_loads_no_openenv
  tests/adapters/test_failures.py
  tests/project/test_soak.py
  tests/sources/test_processor.py
  tests/runtime/test_shutdown.py::test_nothing_ep_trl_started_outlives_a_sigkilled_trainer
  tests/runtime/test_shutdown.py::test_sigterm_ends_training_every_time
)

if [[ ! -x "$venv/bin/python" ]]; then
  printf '[test_openenv010] %s does not exist: run `bash scripts/install_openenv010.sh` first.\n' "$venv" >&2
  exit 1
fi
printf '[test_openenv010] %s: openenv %s\n' "$venv" \
  "$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("openenv"))')" >&2
# the SIGTERM test once per moment, on the Docker-image eval whose OpenEnv servers ep_trl starts (8 in the main suite: each moment with each eval)
EP_TRL_SIGTERM_RUNS=4 exec "$venv/bin/python" -m pytest -q "${TESTS[@]}" "$@"
