"""Installed-version checks, done once at construction rather than as a crash mid-training."""

from importlib import metadata

from packaging.version import Version

from .errors import VersionError


def installed_version(distribution: str) -> Version:
    """The installed version of ``distribution``; a clear error if it is missing."""
    try:
        return Version(metadata.version(distribution))
    except metadata.PackageNotFoundError as exc:
        raise VersionError(f"{distribution} is not installed; install it with `pip install {distribution}`.") from exc


def require_range(distribution: str, minimum: str, below: str) -> Version:
    """Raise unless ``minimum <= version < below``; return the version."""
    version = installed_version(distribution)
    if not Version(minimum) <= version < Version(below):
        raise VersionError(
            f"ep_trl supports {distribution} >={minimum},<{below}, but {version} is installed. "
            f"Install a supported one: pip install '{distribution}>={minimum},<{below}'."
        )
    return version
