"""Installed-version checks, done once at construction rather than as a crash mid-training.

The supported ranges have one source of truth: ep_trl's own requirements in ``pyproject.toml``, read back from the
installed distribution's metadata, so the range pip enforces and the range ep_trl checks cannot drift apart.
"""

from functools import cache
from importlib import metadata

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from ..errors import VersionError

DISTRIBUTION = "ep-trl"


def installed_version(distribution: str) -> Version:
    """The installed version of ``distribution``; a clear error if it is missing."""
    try:
        return Version(metadata.version(distribution))
    except metadata.PackageNotFoundError as exc:
        raise VersionError(f"{distribution} is not installed; install it with `pip install {distribution}`.") from exc


@cache
def supported_range(distribution: str) -> SpecifierSet:
    """The versions of ``distribution`` that ep_trl declares it works with (its ``pyproject.toml`` requirement)."""
    try:
        requirements = metadata.requires(DISTRIBUTION) or []
    except metadata.PackageNotFoundError as exc:
        raise VersionError(
            "ep_trl is imported but not installed, so its supported dependency versions are unknown; install it "
            "with `pip install -e .` from its checkout (or `pip install ep-trl`)."
        ) from exc
    wanted = canonicalize_name(distribution)
    for line in requirements:
        requirement = Requirement(line)
        if canonicalize_name(requirement.name) == wanted:  # a dependency, or one offered through an extra
            return requirement.specifier
    raise VersionError(f"ep_trl declares no requirement on {distribution}; its pyproject.toml must name one.")


def show(specifier: SpecifierSet) -> str:
    """A range as people write it: lower bounds first (``>=1.16,<2``)."""
    return ",".join(sorted((str(s) for s in specifier), key=lambda s: (not s.startswith(">"), s)))


def require_range(distribution: str, specifier: SpecifierSet | str) -> Version:
    """Raise unless the installed ``distribution`` is in ``specifier``; return its version."""
    specifier = SpecifierSet(str(specifier))
    version = installed_version(distribution)
    if version not in specifier:
        raise VersionError(
            f"ep_trl supports {distribution} {show(specifier)}, but {version} is installed. "
            f"Install a supported one: pip install '{distribution}{show(specifier)}'."
        )
    return version


def require_supported(distribution: str) -> Version:
    """Raise unless the installed ``distribution`` is in ep_trl's declared range; return its version."""
    return require_range(distribution, supported_range(distribution))
