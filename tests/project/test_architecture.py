"""The shape of the package: the import graph's layers and direction (scripts/import_layers.py measures them)."""

import ast
import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "import_layers.py"
PACKAGE = ROOT / "src" / "ep_trl"
#: Listed in docs/architecture.md as one row each, not module by module: the tooling and the environments.
LISTED_AS_PACKAGES = ("devtools", "envs")
spec = importlib.util.spec_from_file_location("import_layers", SCRIPT)
assert spec is not None and spec.loader is not None, SCRIPT
import_layers = importlib.util.module_from_spec(spec)
spec.loader.exec_module(import_layers)


def test_the_import_graph_has_at_most_12_layers_and_no_import_points_up() -> None:
    graph = import_layers.imports(import_layers.modules())
    assert len(graph) > 40 and "ep_trl.adapters.rollout_func" in graph["ep_trl"]  # the graph was read, not empty
    chain = import_layers.longest_chain(graph)
    assert chain[0] == "ep_trl" and chain[-1] == "ep_trl.errors", chain
    assert len(chain) <= 12, " -> ".join(chain)
    assert import_layers.upward(graph) == []


def test_the_measure_sees_lazy_imports_and_cycles_but_not_type_checking_imports(tmp_path: Path) -> None:
    package = tmp_path / "ep_trl"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("from .a import f\n")
    (package / "a.py").write_text("def f():\n    from .sub import b\n")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..a import f\nfrom .. import c\n"
    )
    (package / "c.py").write_text("def g():\n    import ep_trl.a\n")
    (package / "d.py").write_text('_LAZY = {"f": ".sub.b", "g": "ep_trl.c"}\n')  # the lazy loader's table
    graph = import_layers.imports(import_layers.modules(package))
    assert graph["ep_trl"] == {"ep_trl.a"} and graph["ep_trl.a"] == {"ep_trl.sub.b"}
    assert graph["ep_trl.d"] == {"ep_trl.sub.b", "ep_trl.c"}
    assert graph["ep_trl.sub.b"] == {"ep_trl.c"}  # the TYPE_CHECKING import is not counted
    assert import_layers.upward(graph) == [
        ("ep_trl.a", "ep_trl.sub.b"),
        ("ep_trl.c", "ep_trl.a"),
        ("ep_trl.sub.b", "ep_trl.c"),
    ]


def test_no_two_packages_import_each_other_type_checking_imports_included() -> None:
    """Issue 49: nine pairs of packages imported each other (``generation`` and ``engine``, ``sources`` and
    ``openenv``, ...) through shared value types kept in feature packages. They now live below every package that
    uses them (``trajectory.episode``, ``trajectory.sampling``, ``evalprotocol.spec.EnvSettings``, ...)."""
    graph = import_layers.imports(import_layers.modules(), type_checking=True)
    assert graph["ep_trl.generation.choice"] >= {"ep_trl.generation.vllm", "ep_trl.generation.trainer"}  # BACKENDS
    pairs = import_layers.package_pairs(graph)
    assert pairs == [], "\n".join(f"{a} <-> {b}: {why}" for a, b, why in pairs)


def test_the_package_measure_sees_type_checking_imports_and_tables_of_modules(tmp_path: Path) -> None:
    package = tmp_path / "ep_trl"
    for sub in ("low", "high"):
        (package / sub).mkdir(parents=True)
        (package / sub / "__init__.py").write_text("")
    (package / "__init__.py").write_text('_LAZY = {"x": ".high.user"}\n')  # the root is left out of pairs
    (package / "high" / "user.py").write_text("from ..low import kinds\n")
    (package / "high" / "kinds.py").write_text("")
    (package / "low" / "kinds.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..high.kinds import T\n"
    )
    (package / "low" / "choice.py").write_text('BACKENDS: dict[str, str] = {"k": "kinds"}\n')
    found = import_layers.modules(package)
    assert import_layers.package_pairs(import_layers.imports(found)) == []  # the TYPE_CHECKING edge is not counted
    graph = import_layers.imports(found, type_checking=True)
    assert graph["ep_trl.low.choice"] == {"ep_trl.low.kinds"}
    assert import_layers.package_pairs(graph) == [
        ("high", "low", [("ep_trl.high.user", "ep_trl.low.kinds"), ("ep_trl.low.kinds", "ep_trl.high.kinds")])
    ]


def test_a_rollout_calls_setup_reads_its_caller_in_one_place() -> None:
    """Issue 34: the caller went into settings, backend choice and rows, each asking it again. Now
    ``engine.call_setup.CallReader.read`` reads it once into a ``CallSetup`` handed down; besides it, only the engine
    that hands a caller to it (``engine.engine``) and the adapters that receive a caller (``adapters.rollout_func``,
    ``adapters.sharded``) name the caller protocol."""
    naming = set()
    for name, path in import_layers.modules().items():
        tree = ast.parse(path.read_text())
        names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
        names |= {node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}
        names |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for alias in node.names}
        names |= {
            node.value
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value == "RolloutCaller"
        }  # a quoted annotation
        if "RolloutCaller" in names:
            naming.add(name)
    assert naming == {
        "ep_trl.engine.caller",
        "ep_trl.engine.call_setup",
        "ep_trl.engine.engine",
        "ep_trl.adapters.rollout_func",
        "ep_trl.adapters.sharded",
    }, sorted(naming)


def _docstring_only(path: Path) -> bool:
    body = ast.parse(path.read_text()).body
    return all(isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) for node in body)


def documented_modules(package: Path = PACKAGE) -> set[str]:
    """What docs/architecture.md's table must list: every module as its path under ``src/ep_trl/``, ``devtools/`` and
    ``envs/`` as packages, a package's ``__init__.py`` only when it holds more than its docstring."""
    wanted = set()
    for path in package.rglob("*.py"):
        relative = path.relative_to(package)
        if relative.parts[0] in LISTED_AS_PACKAGES:
            wanted.add(relative.parts[0] + "/")
        elif not (path.name == "__init__.py" and len(relative.parts) > 1 and _docstring_only(path)):
            wanted.add(relative.as_posix())
    return wanted


def listed_modules(doc: str) -> set[str]:
    table = doc.split("## Modules", 1)[1].split("\n## ", 1)[0]
    return {match for match in re.findall(r"^\| `([^`]+)` \|", table, flags=re.MULTILINE)}


def test_the_architecture_table_lists_every_module_and_no_gone_one() -> None:
    listed = listed_modules((ROOT / "docs" / "architecture.md").read_text())
    wanted = documented_modules()
    assert len(wanted) > 60  # the package was read
    assert wanted - listed == set(), "modules missing from docs/architecture.md's table"
    assert listed - wanted == set(), "docs/architecture.md lists modules that are gone"


def test_the_table_check_sees_a_new_module_and_a_gone_one(tmp_path: Path) -> None:
    package = tmp_path / "ep_trl"
    (package / "engine").mkdir(parents=True)
    (package / "devtools").mkdir()
    (package / "__init__.py").write_text("X = 1\n")
    (package / "engine" / "__init__.py").write_text('"""Only a docstring."""\n')
    (package / "engine" / "new.py").write_text("")
    (package / "devtools" / "tool.py").write_text("")
    assert documented_modules(package) == {"__init__.py", "engine/new.py", "devtools/"}
    doc = "## Modules\n\n| module | holds |\n| `__init__.py` | x |\n| `engine/old.py` | y |\n\n## Layers\n| `z.py` |"
    assert listed_modules(doc) == {"__init__.py", "engine/old.py"}


def test_src_ep_trl_has_at_most_19_entries_besides_its_init() -> None:
    """18 since issue 41's regrouping, and ``compat.py``: the one home of the old names (issue 49). Modules and
    packages count; the ``py.typed`` marker does not."""
    entries = sorted(
        p.name
        for p in PACKAGE.iterdir()
        if p.name not in ("__init__.py", "__pycache__") and (p.suffix == ".py" or (p / "__init__.py").is_file())
    )
    assert len(entries) <= 19, entries


ADAPTERS = PACKAGE / "adapters"
#: The only attribute accesses ``x._name`` in ``adapters/`` where ``x`` is not ``self`` or ``cls``, each with why.
PRIVATE_ACCESS_ALLOWED = {
    "os._exit": "the standard library's public exit without cleanup (a shard process whose trainer is gone)",
    "atexit._run_exitfuncs": "the standard library's only way to run the exit handlers now: a shard process runs "
    "them once its rollout function is closed, then ends without the interpreter's teardown "
    "(sharded._exit), which would hold up the trainer's close for seconds",
    "multiprocessing.process._children": "multiprocessing's list of a process's children, which has no public API: a "
    "forked child must take its parent's shard processes off it "
    "(ShardedRolloutFunction.disown_shards)",
}


def private_accesses(source: str) -> list[str]:
    """Every ``x._name`` in ``source`` (as written, with its line) where ``x`` is not ``self``/``cls`` and ``_name``
    is no dunder, less :data:`PRIVATE_ACCESS_ALLOWED`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Attribute) or not node.attr.startswith("_"):
            continue
        if node.attr.startswith("__") and node.attr.endswith("__"):
            continue
        if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            continue
        if ast.unparse(node) not in PRIVATE_ACCESS_ALLOWED:
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_adapter_reaches_into_another_objects_private_members() -> None:
    """Issue 41: the async worker drove a whole rollout function from outside, and the shard processes' parent read
    another object's ``_workers``. The adapters use the engine's (and each other's) public methods only."""
    found = {path.name: private_accesses(path.read_text()) for path in sorted(ADAPTERS.glob("*.py"))}
    assert len(found) >= 5  # the adapters were read
    assert {name: hits for name, hits in found.items() if hits} == {}


def test_the_private_access_check_sees_what_it_must() -> None:
    source = (
        "self._a; cls._b; x.__name__; os._exit(1); self._function.run(); other._c; self.engine._runner.run()\n"
        "multiprocessing.process._children; import x as _y; _y.z\n"
    )
    assert private_accesses(source) == ["1: other._c", "1: self.engine._runner"]


def test_the_async_worker_holds_an_engine_not_a_rollout_function() -> None:
    """Issue 41: ``EvalRolloutWorker`` built a ``RolloutFunction`` (a GRPO adapter) and drove nine of its members; it
    builds an engine (``ep_trl.engine.engine.build_engine``) and uses its public methods."""
    tree = ast.parse((ADAPTERS / "async_worker.py").read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for alias in node.names}
    imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    named = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    named |= {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    assert "build_engine" in imported and "engine.engine" in imported
    assert not {"RolloutFunction", "create_rollout_func", "create_openenv_vllm_rollout_func", "rollout_func"} & (
        imported | named
    )


#: What code outside ``generation/`` may import of it: the protocol (the package), backend choice, server probing and
#: the versioned view of a backend. The backends themselves (``trainer``, ``vllm``, ``colocate``, and ``batching``,
#: which only they use) are reached through ``generation.choice``.
GENERATION_ENTRIES = frozenset(
    {"ep_trl.generation", "ep_trl.generation.choice", "ep_trl.generation.probe", "ep_trl.generation.versioned"}
)
#: Modules outside ``generation/`` that import a backend module, with the reason (none today: the trainers that drive
#: TRL's engine take nothing of ep_trl's backends, and ``devtools``, ``envs`` and ``cli`` build theirs through
#: ``generation.choice`` like everything else).
BACKEND_IMPORT_EXCEPTIONS: dict[str, str] = {}


def backend_importers(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Each module outside ``generation/`` (``devtools`` and ``envs`` included) that imports a module of
    ``generation/`` other than ``GENERATION_ENTRIES``, with the ones it imports."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = import_layers.imports(found)
    inside = f"{package.name}.generation"
    return {
        name: backends
        for name, targets in graph.items()
        if not (name == inside or name.startswith(inside + "."))
        if (backends := {t for t in targets if t.startswith(inside + ".") and t not in GENERATION_ENTRIES})
    }


def test_no_module_outside_generation_imports_a_backend_module() -> None:
    """Issue 41: ``adapters/rollout_func.py``, ``adapters/async_worker.py``, ``cli/train.py`` and the disk-sync trainer
    imported ``generation.vllm`` to probe a server, and ``cli/serve.py`` built ``generation.trainer``'s backend itself,
    while docs/architecture.md calls ``generation/choice.py`` "the only code that names backends"."""
    importers = backend_importers()
    assert {name: sorted(b) for name, b in importers.items() if name not in BACKEND_IMPORT_EXCEPTIONS} == {}


def test_the_backend_import_check_sees_a_backend_imported_from_outside(tmp_path: Path) -> None:
    package = tmp_path / "ep_trl"
    (package / "generation").mkdir(parents=True)
    (package / "devtools").mkdir()
    for name in ("__init__.py", "generation/__init__.py", "generation/vllm.py", "generation/probe.py"):
        (package / name).write_text("")
    (package / "generation" / "choice.py").write_text("def f():\n    from .vllm import X\n")
    (package / "devtools" / "tool.py").write_text(
        "from ..generation.probe import probe_server\ndef g():\n    from ep_trl.generation import vllm\n"
    )
    assert backend_importers(package) == {"ep_trl.devtools.tool": {"ep_trl.generation.vllm"}}


def package_docstring_problems(package: Path) -> list[str]:
    """What a package docstring under ``package`` gets wrong about its package: a module or subpackage it does not
    name (as ``name``, ``name.py`` or a dotted path ending in it), or a module it names in a bullet (``* ``name``:``)
    that is not there. ``__main__`` and private modules need not be named."""
    problems = []
    for init in sorted(package.rglob("__init__.py")):
        if init.parent == package:
            continue  # the root's docstring lists the public API (tests/project/test_import.py)
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        members = {p.stem for p in init.parent.glob("*.py") if not p.stem.startswith("_")}
        members |= {p.name for p in init.parent.iterdir() if (p / "__init__.py").is_file()}
        where = init.parent.relative_to(package.parent).as_posix()
        for member in sorted(members):
            if not re.search(rf"``(?:[\w.]*\.)?{member}(?:\.py|\.[\w.]+)?``", doc):
                problems.append(f"{where}: the docstring does not name {member}")
        for named in re.findall(r"^\* ``(\w+)``:", doc, flags=re.M):
            if named not in members and not (init.parent / f"{named}.py").exists():
                problems.append(f"{where}: the docstring names {named}, which is not there")
    return problems


def test_every_package_docstring_names_its_modules_and_no_gone_one() -> None:
    assert package_docstring_problems(PACKAGE) == []


def test_the_docstring_check_sees_an_unnamed_module_and_a_gone_one(tmp_path: Path) -> None:
    package = tmp_path / "ep_trl"
    (package / "engine").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "engine" / "__init__.py").write_text('"""The engine.\n\n* ``stream``: x;\n* ``old``: y.\n"""\n')
    for name in ("stream.py", "new.py", "_private.py", "__main__.py"):
        (package / "engine" / name).write_text("")
    assert package_docstring_problems(package) == [
        "ep_trl/engine: the docstring does not name new",
        "ep_trl/engine: the docstring names old, which is not there",
    ]


def test_the_tests_root_holds_only_the_tests_of_the_root_modules() -> None:
    """Issue 49: 26 test files sat at the ``tests/`` root. Each now lives in the folder of what it tests, or in
    ``tests/project/`` for whole-project checks; the root keeps ``test_X.py`` only for a root module ``X.py``."""
    tests = ROOT / "tests"
    root_modules = {p.stem for p in PACKAGE.glob("*.py") if p.name != "__init__.py"}
    loose = sorted(p.name for p in tests.glob("test_*.py") if p.stem.removeprefix("test_") not in root_modules)
    assert loose == [], loose
    assert (tests / "test_compat.py").is_file() and (tests / "project" / "test_docs.py").is_file()


MODULE_LINES = 450


def modules_over(package: Path, limit: int) -> dict[str, int]:
    """The modules under ``package`` with more than ``limit`` lines, and their lines."""
    counts = {str(path.relative_to(package)): len(path.read_text().splitlines()) for path in package.rglob("*.py")}
    return {name: lines for name, lines in counts.items() if lines > limit}


def test_no_module_of_the_package_is_over_450_lines() -> None:
    """Issue 49: a module over 450 lines does several jobs; split it by concern (cli/train.py was 1,222)."""
    assert modules_over(PACKAGE, MODULE_LINES) == {}


def test_the_front_door_is_under_80_lines() -> None:
    """Issue 49: ``ep_trl/__init__.py`` holds the public API and a one-table lazy loader, nothing else (it was 203
    lines: each lazy name written three times and a 34-entry finder for old paths)."""
    assert len((PACKAGE / "__init__.py").read_text().splitlines()) < 80


def test_the_module_size_check_sees_a_long_module(tmp_path: Path) -> None:
    (tmp_path / "short.py").write_text("x = 1\n" * MODULE_LINES)
    (tmp_path / "long.py").write_text("x = 1\n" * (MODULE_LINES + 1))
    assert modules_over(tmp_path, MODULE_LINES) == {"long.py": MODULE_LINES + 1}
