"""Version checks fail at construction with the supported range and the install command."""

from typing import TYPE_CHECKING

import pytest

from ep_trl import VersionError
from ep_trl.runtime.versions import installed_version, require_range, supported_range

if TYPE_CHECKING:
    from collections.abc import Callable


def test_installed_versions_are_in_the_supported_ranges() -> None:
    from ep_trl import evalprotocol
    from ep_trl.adapters import trl_seam

    assert trl_seam.check_version() == installed_version("trl")
    evalprotocol.check_version()


def test_the_supported_ranges_are_the_ones_pyproject_declares() -> None:
    """One source of truth: what pip enforces (pyproject.toml) is what ep_trl checks at construction."""
    import tomllib
    from pathlib import Path

    from packaging.requirements import Requirement

    declared = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    requirements = {Requirement(r).name: Requirement(r).specifier for r in declared["project"]["dependencies"]}
    for name in ("trl", "eval-protocol", "transformers"):
        assert supported_range(name) == requirements[name], name
    assert installed_version("trl") in supported_range("trl")


def test_out_of_range_names_the_range_and_the_fix() -> None:
    with pytest.raises(VersionError, match=r"supports trl >=99,<100, but .* is installed.*pip install 'trl>=99,<100'"):
        require_range("trl", ">=99,<100")


def test_missing_distribution_says_how_to_install_it() -> None:
    with pytest.raises(VersionError, match="not-a-real-dist is not installed; install it with"):
        installed_version("not-a-real-dist")


def test_exactly_one_supported_openenv_distribution_is_required(monkeypatch: pytest.MonkeyPatch) -> None:
    from importlib import metadata

    from ep_trl.openenv.client import check_openenv

    installed = check_openenv()
    assert installed.split()[0] in ("openenv", "openenv-core")
    real = metadata.version

    def versions(table: dict[str, str]) -> "Callable[[str], str]":
        def version(name: str) -> str:
            if name in ("openenv", "openenv-core"):
                if name not in table:
                    raise metadata.PackageNotFoundError(name)
                return table[name]
            return real(name)

        return version

    monkeypatch.setattr(metadata, "version", versions({}))  # fault injection: what pip would report
    with pytest.raises(VersionError, match=r"No OpenEnv is installed.*pip install 'ep-trl\[openenv\]'"):
        check_openenv()
    monkeypatch.setattr(metadata, "version", versions({"openenv": "0.10.0", "openenv-core": "0.3.0"}))
    with pytest.raises(VersionError, match="Both OpenEnv distributions are installed"):
        check_openenv()
    monkeypatch.setattr(metadata, "version", versions({"openenv-core": "0.2.0"}))
    with pytest.raises(VersionError, match=r"supports openenv-core >=0.3.0,<0.4"):
        check_openenv()
