"""A turn's tokens and images: the token-exact trajectory (``tokens``), message content (``content``), the images of a
sample (``sample_images``), a vision model's inputs (``vision_inputs``), and the type aliases every layer shares
(``types``).

``from ep_trl.trajectory import ChatTemplate`` (the module this package was before) keeps working: a public name of
``tokens`` is looked up there at its first use, so importing one of the smaller modules does not import ``tokens``.
"""

from typing import Any

_SUBMODULES = frozenset({"tokens", "content", "sample_images", "vision_inputs", "types"})


def __getattr__(name: str) -> Any:
    if name.startswith("_") or name in _SUBMODULES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from . import tokens

    try:
        return getattr(tokens, name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
