"""The seam to eval-protocol, one job per module.

* ``resolve``: ``env_path`` to one ``@evaluation_test`` (``resolve_eval_test``);
* ``spec``: what the eval configures (``read_eval_spec`` → ``EvalSpec``), and its processor's history lines;
* ``body``: rows shaped like its processor's (``build_row``) and its scoring body run on them (``run_body``);
* ``inputs``: its own input rows (``dataset_messages``);
* ``store``: the row store ``ep logs`` reads (``make_dataset_logger``);
* ``_private``: the one guarded door to eval-protocol names that are not public API.
"""

from ._private import check_version
from .body import build_row, new_id, run_body, score_of
from .inputs import dataset_messages
from .resolve import EvalTest, resolve_eval_test
from .spec import EvalSpec, history_line, read_eval_spec
from .store import StoreLogger, make_dataset_logger

__all__ = [
    "EvalSpec",
    "EvalTest",
    "StoreLogger",
    "build_row",
    "check_version",
    "dataset_messages",
    "history_line",
    "make_dataset_logger",
    "new_id",
    "read_eval_spec",
    "resolve_eval_test",
    "run_body",
    "score_of",
]
