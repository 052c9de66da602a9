"""The README and docs/*.md against the repository: the README's test command is the one CI runs, every relative
link (and its ``#anchor``) resolves, the set-up recipes are written once (docs/setup.md), and every flag a documented
command gives ``ep-trl train`` or a training script is one that command accepts."""

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```.*?^```", flags=re.M | re.S)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _name(page: Path) -> str:
    return page.relative_to(ROOT).as_posix() if ROOT in page.parents else str(page)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but ``-`` and ``_`` dropped, spaces to ``-``."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives ``page``'s headings (outside code blocks), repeated ones numbered ``-1``, ``-2``."""
    found: set[str] = set()
    for heading in re.findall(r"^#{1,6} (.+)$", FENCE.sub("", page.read_text()), flags=re.M):
        slug, n = _slug(heading), 0
        while (slug if n == 0 else f"{slug}-{n}") in found:
            n += 1
        found.add(slug if n == 0 else f"{slug}-{n}")
    return found


def broken_links(page: Path) -> list[str]:
    """``page``'s relative links whose file or heading anchor does not exist."""
    broken = []
    for target in LINK.findall(FENCE.sub("", page.read_text())):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target} (no file {_name(linked)})")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target} (no heading #{anchor} in {_name(linked)})")
    return broken


def test_every_relative_link_and_anchor_resolves() -> None:
    broken = {_name(page): found for page in PAGES if (found := broken_links(page))}
    assert not broken, f"broken links: {broken}"


def test_the_link_check_catches_a_missing_file_and_a_missing_heading(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    (tmp_path / "other.md").write_text("# Two GPUs: `trl vllm-serve` on one\n\n## On CPU\n\n## On CPU\n")
    page.write_text(
        "[a](other.md#two-gpus-trl-vllm-serve-on-one) [b](other.md#on-cpu-1) [c](gone.md) "
        "[d](other.md#on-cpu-2)\n```\n[e](inside-a-code-block.md)\n```\n"
    )
    assert [b.split(" ")[0] for b in broken_links(page)] == ["gone.md", "other.md#on-cpu-2"]


def test_the_readme_test_command_is_the_one_ci_runs() -> None:
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    command = ci[ci.index("# the README's test command") + 1]
    assert f"```bash\n{command}\n```" in (ROOT / "README.md").read_text()


def test_the_readme_keeps_its_install_and_main_job_command() -> None:
    readme = (ROOT / "README.md").read_text()
    assert (
        "```bash\nbash scripts/install.sh && bash scripts/install_browser.sh && python train_browsergym_trl.py\n```"
        in readme
    )
    for script in re.findall(r"bash (scripts/\S+\.sh)", readme):
        assert (ROOT / script).is_file(), script


def test_the_set_up_recipes_are_written_once_in_docs_setup_md() -> None:
    """Which GPU runs what is written in docs/setup.md only; the other pages link there."""
    pages = {_name(page) for page in PAGES if "CUDA_VISIBLE_DEVICES" in page.read_text()}
    assert pages == {"docs/setup.md"}


def _commands(program: str) -> list[list[str]]:
    """Every command line in the pages' bash blocks that runs ``program`` (continuation lines joined), split."""
    found = []
    for page in PAGES:
        for block in re.findall(r"^```bash\n(.*?)^```", page.read_text(), flags=re.M | re.S):
            for line in block.replace("\\\n", " ").splitlines():
                line = line.split("  #")[0]
                if program in line:
                    words = shlex.split(line.replace('"${LETTERS[@]}"', ""))
                    found.append(words[words.index(program.split()[-1]) + 1 :])
    return found


def _flags(words: list[str]) -> set[str]:
    return {w.split("=")[0] for w in words if w.startswith("--")}


@pytest.mark.parametrize(
    "script",
    [
        "train_browsergym_trl.py",
        "recipes/letters/tiny.py",
        "recipes/sentiment/smollm2.py",
        "recipes/doors/smollm2.py",
        "recipes/miniwob/smollm2.py",
    ],
)
def test_documented_flags_of_the_recipes_exist(script: str) -> None:
    commands = _commands(f"python {script}")
    assert commands, f"no documented command runs {script}"
    helped = subprocess.run(
        [sys.executable, str(ROOT / script), "--help"], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert helped.returncode == 0, helped.stderr[-2000:]
    known = set(re.findall(r"--[a-z][a-z0-9-]*", helped.stdout))
    unknown = {flag for words in commands for flag in _flags(words)} - known
    assert not unknown, f"{script} has no {sorted(unknown)}"


def test_documented_flags_of_ep_trl_train_exist() -> None:
    from ep_trl.cli import train

    commands = _commands("ep-trl train")
    assert commands
    known = set(train.make_parser()._option_string_actions)
    unknown = {flag for words in commands for flag in _flags(words)} - known
    assert not unknown, f"ep-trl train has no {sorted(unknown)}"


#: A measured-looking figure in prose: a timing, a speedup or a size with its unit (``3.4 s``, ``1.58x``, ``2 GB``,
#: ``5 minutes``). ``2 x rank`` and ``1280x720`` do not match (a space before ``x``, or a digit after it).
FIGURE = re.compile(
    r"(?<![\w.])\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)?(?: ?(?:ms|s|MB|GB)|x| (?:minutes?|min|seconds))(?![\w.])"
)
#: What makes a figure's paragraph cite its source: a link to docs/benchmarks.md or a result file's path.
CITES = re.compile(r"benchmarks\.md|benchmarks/results/")
#: Bounds and defaults the code sets, named with the setting or the words that say so; they are not measurements.
SETTING = re.compile(
    r"default|timeout|time out|_s\b|_S\b|grace|bounded|up to|within|after|wait|poll|every|later|"
    r"by \d|at least|GiB|concurrency",
    flags=re.I,
)


def uncited_figures(text: str) -> list[str]:
    """The prose paragraphs of ``text`` (outside code blocks and tables) that quote a figure matching ``FIGURE``
    whose sentence names no setting (``SETTING``), in a paragraph that neither links docs/benchmarks.md nor names a
    file under benchmarks/results/."""
    found = []
    for paragraph in re.split(r"\n\s*\n", FENCE.sub("", text)):
        if CITES.search(paragraph):
            continue
        prose = "\n".join(line for line in paragraph.splitlines() if not line.lstrip().startswith("|"))
        for sentence in re.split(r"(?<=[.;:])\s", prose):
            if FIGURE.search(sentence) and not SETTING.search(sentence):
                found.append(" ".join(sentence.split())[:160])
    return found


def test_every_figure_in_the_docs_cites_its_result_file() -> None:
    """A timing, speedup or size measured on a run is quoted in docs/benchmarks.md beside its command and result
    file (checked by tests/project/test_benchmark_results.py); another page links there instead of quoting it (issue
    40)."""
    pages = [page for page in PAGES if page.name != "benchmarks.md"]
    uncited = {_name(page): found for page in pages if (found := uncited_figures(page.read_text()))}
    assert not uncited, f"figures with no result file: {uncited}"


def test_the_figure_check_catches_an_uncited_timing_and_spares_settings_and_code() -> None:
    page = (
        "The server starts in 35-60 s on 2 cores.\n\n"
        "Two processes play 1.58x the episodes of one ([benchmarks.md](benchmarks.md#x)).\n\n"
        "Calls time out after 60 s. The grace is 25 s by default. LoRA alpha is 2 x rank; a 1280x720 page.\n\n"
        "```\nwall 340s and 3.4 s\n```\n\n| a | 3 s |\n\nThe install takes about 3 minutes and 3.4 GB.\n"
    )
    assert uncited_figures(page) == [
        "The server starts in 35-60 s on 2 cores.",
        "The install takes about 3 minutes and 3.4 GB.",
    ]


def stale_test_names(text: str, root: Path) -> list[str]:
    """``tests/...py`` paths (and ``::test_name``) in ``text`` that name no file, or no such test in it."""
    stale = []
    for path, name in re.findall(r"\b(tests/[\w/]+\.py)(?:::(\w+))?", text):
        if not (root / path).is_file():
            stale.append(path)
        elif name and not re.search(rf"^(async )?def {name}\b", (root / path).read_text(), flags=re.M):
            stale.append(f"{path}::{name}")
    return stale


def test_every_test_the_docs_and_docstrings_name_exists() -> None:
    """The docs and ep_trl's own docstrings name tests by path: each is there (``docs/vllm-cpu.md`` and
    ``docs/browsergym.md`` named tests that had moved or gone)."""
    texts = {page: page.read_text() for page in PAGES}
    texts.update({path: path.read_text() for path in sorted((ROOT / "src" / "ep_trl").rglob("*.py"))})
    stale = {_name(page): found for page, text in texts.items() if (found := stale_test_names(text, ROOT))}
    assert stale == {}


def test_the_stale_test_check_sees_a_gone_file_and_a_gone_test(tmp_path: Path) -> None:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_a.py").write_text("def test_here():\n    pass\n")
    text = "`tests/test_a.py::test_here`, `tests/test_a.py::test_gone`, `tests/test_b.py`"
    assert stale_test_names(text, tmp_path) == ["tests/test_a.py::test_gone", "tests/test_b.py"]
