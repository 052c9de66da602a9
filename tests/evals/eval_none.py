"""A module with no eval test at all (a bridge must say so clearly)."""


def not_an_eval() -> int:
    """A plain function; it carries no ``__ep_params__``."""
    return 0
