"""The layers of ep_trl's import graph, and any import that points up.

    python scripts/import_layers.py [--json]

Every ``import`` of an ``ep_trl`` module by another counts, at module level or inside a function (a lazy import is
still a dependency); for the layers, imports under ``if TYPE_CHECKING:`` do not (they name a type and run nothing).
``from .pkg import name`` counts as an import of ``pkg.name`` when that is a module, else of ``pkg``. A module-level
table that imports modules by name counts as an import of each module it names: ``_LAZY = {name: ".module", ...}``
(the root package's lazy loader, which imports each module at its name's first use) and ``BACKENDS = {name:
"module", ...}`` (``generation.choice``, which imports the backend it picks from its own package). A package's
``__init__`` is a module of its own, and importing a submodule is not counted as importing its package.

* **Layers**: the number of modules on the longest import chain from ``ep_trl`` (the package users import) down to a
  module that imports nothing of ep_trl's. ``ep_trl.devtools`` (tooling that drives the public API as a script does)
  and ``ep_trl.envs`` (the project's environments, which run as their own servers) are left out.
* **Upward imports**: an import on a cycle (module A imports B, and B reaches A): one of the two points up.
* **Package pairs**: two packages of ``ep_trl`` (``engine``, ``sources``, ...; a top-level module counts as one) of
  which each imports the other, ``TYPE_CHECKING`` imports included (a type that two packages share belongs below
  both). The root package, which exports every package's public names, is left out.

``tests/project/test_architecture.py`` holds the project to at most 12 layers, no upward import and no package pair.
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


#: Module-level tables whose string values name modules that the module imports by name.
LOADER_TABLES = ("_LAZY", "BACKENDS")


def _table_values(node: ast.AST) -> list[str] | None:
    """The string values of a module-level ``LOADER_TABLES`` dict (assigned, or annotated and assigned)."""
    if isinstance(node, ast.Assign):
        targets, value = node.targets, node.value
    elif isinstance(node, ast.AnnAssign) and node.value is not None:
        targets, value = [node.target], node.value
    else:
        return None
    if not isinstance(value, ast.Dict) or not any(isinstance(t, ast.Name) and t.id in LOADER_TABLES for t in targets):
        return None
    return [v.value for v in value.values if isinstance(v, ast.Constant) and isinstance(v.value, str)]


def imports(found: dict[str, Path], type_checking: bool = False) -> dict[str, set[str]]:
    """Each module's ep_trl imports (module names in ``found``); those under ``if TYPE_CHECKING:`` too when
    ``type_checking``."""

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
                if _is_type_checking(child) and not type_checking:
                    stack.extend(child.orelse)
                    continue
                wanted: list[str] = []
                table = _table_values(child) if isinstance(node, ast.Module) else None
                if table is not None:
                    for value in table:
                        if value.startswith("."):
                            wanted.append(f"{package}{value}")
                        elif value.startswith("ep_trl"):
                            wanted.append(value)
                        elif f"{package}.{value}" in found:  # a module of this package, by its bare name
                            wanted.append(f"{package}.{value}")
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


def top_package(module: str) -> str:
    """The package (or top-level module) of ``ep_trl`` that ``module`` belongs to; ``ep_trl`` for the root."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def package_pairs(graph: dict[str, set[str]]) -> list[tuple[str, str, list[tuple[str, str]]]]:
    """Every two packages that import each other, with the module imports that make each direction."""
    edges: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for a, targets in graph.items():
        for b in targets:
            pa, pb = top_package(a), top_package(b)
            if pa != pb and "ep_trl" not in (pa, pb):
                edges.setdefault((pa, pb), []).append((a, b))
    return [
        (pa, pb, sorted(edges[(pa, pb)] + edges[(pb, pa)])) for pa, pb in sorted(edges) if pa < pb and (pb, pa) in edges
    ]


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
    found = modules()
    graph = imports(found)
    chain, cycles = longest_chain(graph), upward(graph)
    pairs = package_pairs(imports(found, type_checking=True))
    if args.json:
        figures = {"layers": len(chain), "chain": chain, "upward": cycles, "modules": len(graph)}
        print(json.dumps(figures | {"package_pairs": [[a, b] for a, b, _ in pairs]}))
        return
    print(f"{len(graph)} modules, {len(chain)} layers: " + " -> ".join(chain))
    print(f"{len(cycles)} upward imports" + "".join(f"\n  {a} -> {b}" for a, b in cycles))
    print(
        f"{len(pairs)} package pairs"
        + "".join(f"\n  {a} <-> {b}: " + ", ".join(f"{x} -> {y}" for x, y in why) for a, b, why in pairs)
    )
    sys.exit(1 if cycles or pairs else 0)


if __name__ == "__main__":
    main()
