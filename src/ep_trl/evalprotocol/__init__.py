"""The seam to eval-protocol, one job per module.

* ``resolve``: ``env_path`` to one ``@evaluation_test`` (``resolve_eval_test``);
* ``spec``: what the eval configures (``read_eval_spec`` → ``EvalSpec``), and its processor's history lines;
* ``body``: rows shaped like its processor's (``build_row``) and its scoring body run on them (``run_body``);
* ``inputs``: its own input rows as ``evaluation_test`` reads them (``eval_rows``), as training prompts carrying
  a row key (``training_prompts``), and TRL prompts mapped back to rows (``match_rows``);
* ``processors``: its processor run on one row as ``evaluation_test`` does, the model routed to ep_trl's endpoint;
* ``mcp_servers``: its stdio MCP servers under the watchdog, and what they said on stderr;
* ``mcp_gym``: MCP-gym episodes started on their row's seed;
* ``store``: the row store ``ep logs`` reads (``make_dataset_logger``);
* ``_private``: the one guarded door to eval-protocol names that are not public API.
"""

from ._private import check_version
from .body import build_row, new_id, run_body, score_of, stamp_row
from .inputs import ROW_KEY, check_rows, eval_rows, match_rows, row_key, strip_row_key, training_prompts
from .resolve import EvalTest, resolve_eval_test
from .spec import EvalSpec, history_line, read_eval_spec
from .store import StoreLogger, make_dataset_logger

__all__ = [
    "ROW_KEY",
    "EvalSpec",
    "EvalTest",
    "StoreLogger",
    "build_row",
    "stamp_row",
    "check_version",
    "eval_rows",
    "history_line",
    "make_dataset_logger",
    "check_rows",
    "match_rows",
    "new_id",
    "read_eval_spec",
    "resolve_eval_test",
    "row_key",
    "run_body",
    "score_of",
    "strip_row_key",
    "training_prompts",
]
