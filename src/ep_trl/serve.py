"""Moved: ``ep-trl serve MODEL_DIR`` (``ep_trl.cli.serve``). This module keeps ``python -m ep_trl.serve`` and
``from ep_trl.serve import ...`` working for now, with a ``DeprecationWarning``."""

import warnings

warnings.warn("ep_trl.serve moved to ep_trl.cli.serve: run `ep-trl serve MODEL_DIR` (or "
              "`python -m ep_trl.cli serve MODEL_DIR`)", DeprecationWarning, stacklevel=2)

from .cli.serve import build_endpoint, main  # noqa: E402  (after the warning, as an alias module does)

__all__ = ["build_endpoint", "main"]

if __name__ == "__main__":
    main()
