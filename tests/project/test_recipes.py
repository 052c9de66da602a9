"""The layout of what a user starts from (issue 49, "One place to start"): the main job, ``train_browsergym_trl.py``,
is the only training script at the top level; every other recipe is in ``recipes/TASK/MODEL.{py,yaml}``; the evals
they train on are in ``evals/eval_TASK.py``; and the recipes use the presets' public API (``from ep_trl.cli import
...``), never ``ep_trl.cli``'s modules."""

import ast
import re
from pathlib import Path

import ep_trl.cli

ROOT = Path(__file__).resolve().parents[2]
MAIN_JOB = "train_browsergym_trl.py"
#: What a recipe's folder holds besides its recipes: the data its config reads.
DATA_SUFFIXES = {".jsonl"}


def files(folder: str) -> list[str]:
    """The files under ``folder`` (Python's bytecode caches aside), relative to the repository."""
    found = (p for p in (ROOT / folder).rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    return sorted(p.relative_to(ROOT).as_posix() for p in found)


def test_the_main_job_is_the_only_training_script_at_the_top_level() -> None:
    assert sorted(p.name for p in ROOT.glob("*.py")) == [MAIN_JOB]


def test_every_recipe_is_in_recipes_named_for_its_task_and_model() -> None:
    recipes = files("recipes")
    misplaced = [
        path
        for path in recipes
        if not re.fullmatch(r"recipes/[a-z0-9_]+/[a-z0-9_]+\.(py|yaml)", path)
        and Path(path).suffix not in DATA_SUFFIXES
    ]
    assert misplaced == []
    assert {"recipes/letters/tiny.py", "recipes/frozen_lake/smollm2.yaml"} <= set(recipes)


def test_the_evals_are_in_evals_named_for_their_task() -> None:
    evals = files("evals")
    assert evals, "evals/ holds no eval"
    assert [p for p in evals if p.endswith(".py") and not re.fullmatch(r"evals/eval_[a-z0-9_]+\.py", p)] == []
    assert not (ROOT / "examples").exists()


def test_the_readme_starts_with_the_letters_recipe() -> None:
    """The README's "Start here": the install, then the letters recipe (minutes on a CPU, no browser)."""
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"## Start here\n\n```bash\n(.*?)```", readme, flags=re.S)
    assert block is not None
    commands = [line.split("  #")[0].strip() for line in block.group(1).splitlines()]
    assert commands == ["bash scripts/install.sh", "python recipes/letters/tiny.py"]


def cli_internals(source: str) -> list[str]:
    """The imports in ``source`` that reach into ``ep_trl.cli``'s modules (``ep_trl.cli.X``, or ``X`` from
    ``ep_trl.cli`` when X is not one of its public names)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if alias.name.startswith("ep_trl.cli.")]
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            if node.module.startswith("ep_trl.cli."):
                found.append(node.module)
            elif node.module == "ep_trl.cli":
                found += [f"ep_trl.cli.{a.name}" for a in node.names if a.name not in ep_trl.cli.__all__]
    return found


def test_no_recipe_imports_the_cli_s_modules() -> None:
    recipes = [ROOT / MAIN_JOB, *sorted((ROOT / "recipes").rglob("*.py"))]
    reached = {p.relative_to(ROOT).as_posix(): found for p in recipes if (found := cli_internals(p.read_text()))}
    assert reached == {}


def test_the_import_check_sees_a_module_of_the_cli() -> None:
    source = (
        "import ep_trl.cli.modes\n"
        "from ep_trl.cli.presets import Preset\n"
        "from ep_trl.cli import train, run_preset\n"
        "from ep_trl.cli import Preset as P\n"
        "import ep_trl.cli\n"
    )
    assert cli_internals(source) == ["ep_trl.cli.modes", "ep_trl.cli.presets", "ep_trl.cli.train"]


def test_the_public_names_are_there() -> None:
    """Every name ``ep_trl.cli`` lists is importable from it (imported at first use)."""
    assert all(getattr(ep_trl.cli, name) is not None for name in ep_trl.cli.__all__)
