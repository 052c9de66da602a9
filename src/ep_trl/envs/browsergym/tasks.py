"""The MiniWoB++ task catalogue: where the task pages live and which task names are valid.

Task pages come from the ``miniwob`` pip package (``miniwob/html/miniwob/*.html``)
served as ``file://`` URLs, so no HTTP server or network is needed.
``MINIWOB_URL`` (BrowserGym's own variable) overrides that location.
"""

import difflib
import importlib.util
import os
from functools import lru_cache
from pathlib import Path

#: Server-side default task when ``reset`` names none.
TASK_ENV_VAR = "BROWSERGYM_TASK_NAME"
DEFAULT_TASK = "click-test"
#: BrowserGym's variable for the folder URL holding the MiniWoB task pages.
MINIWOB_URL_ENV_VAR = "MINIWOB_URL"

_GYM_PREFIX = "browsergym/miniwob."
_INSTALL_HINT = "run scripts/install_browser.sh (or pip install browsergym-miniwob==0.14.3 miniwob==1.1.0)"


def miniwob_base_url() -> str:
    """URL of the folder of MiniWoB task pages, ending in '/' as BrowserGym concatenates names to it.

    ``MINIWOB_URL`` wins when set; otherwise the ``miniwob`` package's bundled
    pages are used (located without importing the package, which would
    register its own gym environments).
    """
    configured = os.environ.get(MINIWOB_URL_ENV_VAR, "").strip()
    if configured:
        return configured if configured.endswith("/") else configured + "/"
    spec = importlib.util.find_spec("miniwob")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"The 'miniwob' package (MiniWoB++ task pages) is not installed: {_INSTALL_HINT}.")
    html_dir = Path(next(iter(spec.submodule_search_locations))) / "html" / "miniwob"
    if not (html_dir / f"{DEFAULT_TASK}.html").is_file():
        raise RuntimeError(f"No MiniWoB task pages under {html_dir}; reinstall miniwob: {_INSTALL_HINT}.")
    return html_dir.as_uri() + "/"


@lru_cache(maxsize=1)
def available_tasks() -> tuple[str, ...]:
    """Names of the MiniWoB tasks BrowserGym registers (e.g. 'click-test'), sorted."""
    try:
        import browsergym.miniwob  # noqa: F401  (import registers the tasks with gymnasium)
        import gymnasium
    except ImportError as exc:
        raise RuntimeError(f"BrowserGym MiniWoB is not installed ({exc}): {_INSTALL_HINT}.") from exc
    return tuple(sorted(env_id[len(_GYM_PREFIX) :] for env_id in gymnasium.registry if env_id.startswith(_GYM_PREFIX)))


def default_task() -> str:
    """Task used when ``reset`` names none: ``BROWSERGYM_TASK_NAME`` or 'click-test'."""
    return os.environ.get(TASK_ENV_VAR, "").strip() or DEFAULT_TASK


def resolve_task(name: str) -> str:
    """Validate a task name and return its bare form ('click-test').

    Accepts 'click-test', 'miniwob.click-test' and 'browsergym/miniwob.click-test'.
    An unknown name raises ValueError naming close matches and a few valid tasks.
    """
    bare = name.strip()
    for prefix in (_GYM_PREFIX, "miniwob."):
        if bare.startswith(prefix):
            bare = bare[len(prefix) :]
    tasks = available_tasks()
    if bare in tasks:
        return bare
    close = difflib.get_close_matches(bare, tasks, n=3)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    examples = ", ".join(tasks[:8])
    raise ValueError(
        f"Unknown MiniWoB task {name!r}.{hint} Valid tasks ({len(tasks)}) include: {examples}, ... "
        f"(see ep_trl.envs.browsergym.tasks.available_tasks())."
    )


def gym_id(task: str) -> str:
    """gymnasium id BrowserGym registered for a bare task name."""
    return f"{_GYM_PREFIX}{task}"
