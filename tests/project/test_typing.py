"""The package's types: ``Any`` is counted (outside ``devtools/`` and ``envs/``) so it only goes down. mypy itself runs
in CI (``python -m mypy`` in the README's test command, before pytest; 40 to 60 s cold on two loaded cores), not
here: the same command would run twice."""

import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "ep_trl"
#: ``Any`` in the package at this commit: 527 before issue 41, whose target was at most 263 (half); 62 after its
#: typing work (what is left is said where it stands: forwarded ``**kwargs`` of TRL's constructors, untyped
#: outside libraries, numpy's ``__setstate__``).
ANY_CEILING = 62
#: The same rule as ``grep -rwo Any --include=*.py src/ep_trl``: "Any" as a whole word (letters, digits, underscore).
_ANY = re.compile(r"(?<![A-Za-z0-9_])Any(?![A-Za-z0-9_])")


def any_count(package: Path = PACKAGE) -> int:
    return sum(
        len(_ANY.findall(path.read_text()))
        for path in package.rglob("*.py")
        if path.relative_to(package).parts[0] not in ("devtools", "envs")
    )


def test_any_stays_at_or_below_its_ceiling() -> None:
    count = any_count()
    assert count <= ANY_CEILING, (
        f"{count} uses of Any in src/ep_trl (devtools/ and envs/ aside), above {ANY_CEILING}: name the type (an alias "
        "of ep_trl.trajectory.types, a protocol, object where nothing is assumed)"
    )


def test_the_count_reads_whole_words_outside_devtools_and_envs(tmp_path: Path) -> None:
    (tmp_path / "devtools").mkdir()
    (tmp_path / "a.py").write_text("from typing import Any\nx: Any\nAnyOf = 1\nMany = 2\n_Any = 3\n")
    (tmp_path / "devtools" / "b.py").write_text("from typing import Any\n")
    assert any_count(tmp_path) == 2


def test_the_package_says_it_is_typed_and_mypy_requires_annotations() -> None:
    """PEP 561: ``py.typed`` ships with the package (a user's mypy read ep_trl as untyped: "missing library stubs or
    py.typed marker"), and mypy refuses an unannotated function of ep_trl's (``disallow_untyped_defs``)."""
    import tomllib

    assert (PACKAGE / "py.typed").is_file()
    project = tomllib.loads((PACKAGE.parents[1] / "pyproject.toml").read_text())
    assert "py.typed" in project["tool"]["setuptools"]["package-data"]["ep_trl"]
    assert project["tool"]["mypy"]["disallow_untyped_defs"] is True
