#!/usr/bin/env bash
# Install what the BrowserGym MiniWoB++ environment (ep_trl.envs.browsergym) needs, offline-friendly.
#
# Why this exists: browsergym-core pins playwright 1.44, whose own Chromium build cannot be downloaded
# here (package registries only). Debian's `chromium` package works instead, once playwright's expected
# executable path points at it. Safe to run repeatedly: every step checks before it acts.
#
# Environment:
#   PYTHON                    interpreter whose site-packages receive the pip packages (default: python3)
#   PLAYWRIGHT_BROWSERS_PATH  where playwright looks for browsers (default: ~/.cache/ms-playwright)
set -euo pipefail

PYTHON="${PYTHON:-python3}"
DEBIAN_CHROMIUM="/usr/lib/chromium/chromium"
# Versions that work together: browsergym-core 0.14.3 requires playwright==1.44 exactly.
PIP_PACKAGES=(
  "browsergym-core==0.14.3"
  "browsergym-miniwob==0.14.3"
  "miniwob==1.1.0"
  "playwright==1.44.0"
)

log() { printf '[install_browser] %s\n' "$*"; }
die() { printf '[install_browser] ERROR: %s\n' "$*" >&2; exit 1; }

# 1. Debian chromium --------------------------------------------------------------------------------
if [[ -x "$DEBIAN_CHROMIUM" ]]; then
  log "chromium already installed: $DEBIAN_CHROMIUM"
else
  if [[ "$(id -u)" -eq 0 ]]; then
    SUDO=()
  elif command -v sudo >/dev/null 2>&1; then
    SUDO=(sudo)
  else
    die "Debian chromium is missing and installing it needs root: run this script as root or install sudo."
  fi
  log "installing Debian chromium with apt-get (needs the Debian mirror)"
  "${SUDO[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y -qq --no-install-recommends chromium
  [[ -x "$DEBIAN_CHROMIUM" ]] || die "apt-get installed chromium but $DEBIAN_CHROMIUM is absent; see 'dpkg -L chromium'."
  log "installed chromium: $("$DEBIAN_CHROMIUM" --version 2>/dev/null || echo unknown version)"
fi

# 2. Python packages ---------------------------------------------------------------------------------
missing=()
for spec in "${PIP_PACKAGES[@]}"; do
  name="${spec%%==*}"
  want="${spec##*==}"
  have="$("$PYTHON" -c "import importlib.metadata as m, sys
try:
    print(m.version(sys.argv[1]))
except m.PackageNotFoundError:
    print('')" "$name")"
  if [[ "$have" == "$want" ]]; then
    log "pip package present: $name==$have"
  else
    missing+=("$spec")
  fi
done
if (( ${#missing[@]} )); then
  log "pip installing: ${missing[*]}"
  "$PYTHON" -m pip install --quiet "${PIP_PACKAGES[@]}"
fi

# 3. Point playwright's expected Chromium at Debian's ----------------------------------------------------
# Ask the installed playwright where it expects its Chromium (honours PLAYWRIGHT_BROWSERS_PATH), so the
# revision directory (chromium-1117 for playwright 1.44) is never guessed.
expected="$("$PYTHON" - <<'PY'
from playwright.sync_api import sync_playwright

with sync_playwright() as p:
    print(p.chromium.executable_path)
PY
)"
[[ -n "$expected" ]] || die "playwright did not report a Chromium executable path."

if [[ -L "$expected" && "$(readlink "$expected")" == "$DEBIAN_CHROMIUM" ]]; then
  log "playwright chromium already linked: $expected -> $DEBIAN_CHROMIUM"
else
  if [[ -e "$expected" && ! -L "$expected" ]]; then
    die "$expected exists and is not our symlink (a real playwright Chromium?); remove it to use Debian's chromium."
  fi
  mkdir -p "$(dirname "$expected")"
  ln -sfn "$DEBIAN_CHROMIUM" "$expected"
  log "linked playwright chromium: $expected -> $DEBIAN_CHROMIUM"
fi

# 4. Smoke test: launch headless through playwright -----------------------------------------------------
"$PYTHON" - <<'PY'
from playwright.sync_api import sync_playwright

with sync_playwright() as p:
    browser = p.chromium.launch(headless=True)
    print(f"[install_browser] playwright launched chromium {browser.version} headless: OK")
    browser.close()
PY
