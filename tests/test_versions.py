"""Version checks fail at construction with the supported range and the install command."""

import pytest

from ep_trl import VersionError
from ep_trl.versions import installed_version, require_range, supported_range


def test_installed_versions_are_in_the_supported_ranges():
    from ep_trl import evalprotocol, trl_compat

    assert trl_compat.check_version() == installed_version("trl")
    evalprotocol.check_version()


def test_the_supported_ranges_are_the_ones_pyproject_declares():
    """One source of truth: what pip enforces (pyproject.toml) is what ep_trl checks at construction."""
    import tomllib
    from pathlib import Path

    from packaging.requirements import Requirement

    declared = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    requirements = {Requirement(r).name: Requirement(r).specifier for r in declared["project"]["dependencies"]}
    for name in ("trl", "eval-protocol", "transformers"):
        assert supported_range(name) == requirements[name], name
    assert installed_version("trl") in supported_range("trl")


def test_out_of_range_names_the_range_and_the_fix():
    with pytest.raises(VersionError, match=r"supports trl >=99,<100, but .* is installed.*pip install 'trl>=99,<100'"):
        require_range("trl", ">=99,<100")


def test_missing_distribution_says_how_to_install_it():
    with pytest.raises(VersionError, match="not-a-real-dist is not installed; install it with"):
        installed_version("not-a-real-dist")
