"""``python -m ep_trl.cli``: the ``ep-trl`` command."""

import sys

from . import main

sys.exit(main())
