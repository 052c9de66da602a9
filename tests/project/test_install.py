"""Installing ep_trl leaves a user's OpenEnv alone.

OpenEnv ships as two PyPI distributions, ``openenv`` (0.10) and ``openenv-core`` (0.3), that write the same
``openenv`` package. ep_trl depends on neither (one extra each), so installing it next to ``openenv`` 0.10 must not
pull ``openenv-core`` on top, which would overwrite 0.10's files.

NEEDS the venv made by ``bash scripts/install_openenv010.sh`` (``.venv-openenv010``, or ``$OPENENV010_VENV``):
openenv==0.10.0 installed first, then ``pip install -e ".[test,openenv]"``. Without it these tests fail with
that instruction. The dry run also needs the package index, as any pip install does (to build ep_trl's
metadata in an isolated build environment). About 8 s in all.
"""

import json
import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.openenv010

REPO_ROOT = Path(__file__).resolve().parents[2]
OPENENV_VERSION = "0.10.0"

#: Run inside the venv: openenv's version, openenv-core's (None if absent), the files of openenv whose
#: content no longer matches openenv's own RECORD (what a second distribution writing the package changes),
#: and where ep_trl would import from.
STATE_PROBE = r"""
import base64, hashlib, importlib.metadata as md, json

def version(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None

changed, checked = [], 0
if version("openenv") is not None:
    for f in md.distribution("openenv").files or []:
        if f.hash is None:
            continue
        path = f.locate()
        if not path.is_file():
            changed.append(f"{f} (missing)")
            continue
        digest = base64.urlsafe_b64encode(hashlib.new(f.hash.mode, path.read_bytes()).digest()).rstrip(b"=").decode()
        checked += 1
        if digest != f.hash.value:
            changed.append(str(f))

import importlib.util
print(json.dumps({"openenv": version("openenv"), "openenv-core": version("openenv-core"),
                  "changed": changed, "checked": checked, "ep_trl": importlib.util.find_spec("ep_trl").origin}))
"""


def _venv() -> Path:
    venv = Path(os.environ.get("OPENENV010_VENV", ".venv-openenv010"))
    return venv if venv.is_absolute() else REPO_ROOT / venv


@pytest.fixture(scope="module")
def venv_python() -> Path:
    python = _venv() / "bin" / "python"
    if not python.is_file():
        pytest.fail(f"{python} does not exist: run `bash scripts/install_openenv010.sh` first (about 1 minute).")
    return python


def _run(cmd: list, timeout: float = 120) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO_ROOT)
    # pip's configuration on some machines names local index folders that lack most projects: drop that noise.
    stderr = "\n".join(line for line in proc.stderr.splitlines() if "is ignored: it is neither" not in line)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} exited {proc.returncode}:\n{proc.stdout}\n{stderr}"
    return proc


def test_openenv_010_is_untouched_by_the_installed_ep_trl(venv_python: Path) -> None:
    """The real install (scripts/install_openenv010.sh): openenv 0.10.0 with its own files, no openenv-core."""
    state = json.loads(_run([str(venv_python), "-c", STATE_PROBE]).stdout)
    assert state["openenv"] == OPENENV_VERSION
    assert state["openenv-core"] is None, "openenv-core was installed next to openenv and overwrote its files"
    assert state["checked"] > 100, state  # openenv 0.10.0's RECORD hashes ~200 files
    assert state["changed"] == [], f"files of openenv {OPENENV_VERSION} were overwritten: {state['changed'][:10]}"
    assert REPO_ROOT in Path(state["ep_trl"]).resolve().parents, state["ep_trl"]


def test_installing_ep_trl_would_install_nothing_but_itself(venv_python: Path, tmp_path: Path) -> None:
    """``pip install -e .`` of this checkout, as a dry run, next to openenv 0.10: no openenv-core, openenv kept.

    The venv already satisfies every other requirement, so anything else in the report is a requirement that
    openenv 0.10 does not satisfy (such as a hard ``openenv-core`` dependency).
    """
    report = tmp_path / "report.json"
    _run(
        [
            str(venv_python),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--dry-run",
            "--report",
            str(report),
            "-e",
            str(REPO_ROOT),
        ]
    )
    would_install = {
        item["metadata"]["name"]: item["metadata"]["version"] for item in json.loads(report.read_text())["install"]
    }
    assert "openenv-core" not in would_install, would_install
    assert "openenv" not in would_install, would_install  # neither replaced nor up/downgraded
    assert set(would_install) == {"ep-trl"}, would_install
