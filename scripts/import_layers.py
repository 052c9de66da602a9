"""The layers of ep_trl's import graph, and any import that points up.

    python scripts/import_layers.py [--json]

Every ``import`` of an ``ep_trl`` module by another counts, at module level or inside a function (a lazy import is
still a dependency); imports under ``if TYPE_CHECKING:`` do not (they name a type and run nothing). ``from .pkg import
name`` counts as an import of ``pkg.name`` when that is a module, else of ``pkg``. A module-level table ``_LAZY = {name:
".module", ...}`` (the root package's lazy loader, which imports each module at its name's first use) counts as an
import of each module it names. A package's ``__init__`` is a module of its own, and importing a submodule is not
counted as importing its package.

* **Layers**: the number of modules on the longest import chain from ``ep_trl`` (the package users import) down to a
  module that imports nothing of ep_trl's. ``ep_trl.devtools`` (tooling that drives the public API as a script does)
  and ``ep_trl.envs`` (the project's environments, which run as their own servers) are left out.
* **Upward imports**: an import on a cycle (module A imports B, and B reaches A): one of the two points up.

``tests/test_architecture.py`` holds the project to at most 12 layers and no upward import.
"""

import argparse
import ast
import json
import sys
from functools import cache
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "ep_trl"
LEFT_OUT = ("ep_trl.devtools", "ep_trl.envs")


def modules(package: Path = PACKAGE) -> dict[str, Path]:
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        name = ".".join(parts)
        if not name.startswith(LEFT_OUT):
            found[name] = path
    return found


def _is_type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")
    )


def imports(found: dict[str, Path]) -> dict[str, set[str]]:
    """Each module's ep_trl imports (module names in ``found``)."""

    def resolve(name: str) -> str | None:
        while name and name not in found:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in found.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        stack: list[ast.AST] = [ast.parse(path.read_text())]
        while stack:
            node = stack.pop()
            for child in ast.iter_child_nodes(node):
                if _is_type_checking(child):
                    stack.extend(child.orelse)
                    continue
                wanted: list[str] = []
                if (
                    isinstance(child, ast.Assign)
                    and isinstance(node, ast.Module)
                    and isinstance(child.value, ast.Dict)
                    and any(isinstance(t, ast.Name) and t.id == "_LAZY" for t in child.targets)
                ):
                    for value in child.value.values:
                        if isinstance(value, ast.Constant) and isinstance(value.value, str):
                            relative = value.value.startswith(".")
                            wanted.append(f"{package}{value.value}" if relative else value.value)
                elif isinstance(child, ast.Import):
                    wanted = [alias.name for alias in child.names]
                elif isinstance(child, ast.ImportFrom):
                    if child.level:
                        base = package.split(".")[: len(package.split(".")) - (child.level - 1)]
                        source = ".".join(base + ([child.module] if child.module else []))
                    else:
                        source = child.module or ""
                    wanted = [f"{source}.{a.name}" if f"{source}.{a.name}" in found else source for a in child.names]
                for target in wanted:
                    resolved = resolve(target) if target.startswith("ep_trl") else None
                    if resolved and resolved != name:
                        targets.add(resolved)
                stack.append(child)
        graph[name] = targets
    return graph


def upward(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Every import on a cycle."""

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            current = todo.pop()
            if current == goal:
                return True
            if current not in seen:
                seen.add(current)
                todo.extend(graph[current])
        return False

    return sorted((a, b) for a in graph for b in graph[a] if reaches(b, a))


def longest_chain(graph: dict[str, set[str]], top: str = "ep_trl") -> list[str]:
    """The longest import chain from ``top`` (cycles, if any, are cut where they close)."""

    @cache
    def chain(module: str, above: frozenset[str]) -> tuple[str, ...]:
        below = [chain(d, above | {module}) for d in sorted(graph[module]) if d not in above and d != module]
        return (module,) + max(below, key=len, default=())

    return list(chain(top, frozenset()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    graph = imports(modules())
    chain, cycles = longest_chain(graph), upward(graph)
    if args.json:
        print(json.dumps({"layers": len(chain), "chain": chain, "upward": cycles, "modules": len(graph)}))
        return
    print(f"{len(graph)} modules, {len(chain)} layers: " + " -> ".join(chain))
    print(f"{len(cycles)} upward imports" + "".join(f"\n  {a} -> {b}" for a, b in cycles))
    sys.exit(1 if cycles else 0)


if __name__ == "__main__":
    main()
