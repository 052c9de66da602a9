"""``python -m ep_trl.cli``: the ``ep-trl`` command. Importing this module runs nothing (a tool that imports every
module of the package, such as ``pkgutil`` or a documentation builder, must not run the command)."""

import sys

from . import main

if __name__ == "__main__":
    sys.exit(main())
