"""Every docs page reads correctly as a file: its generated parts are current (`docs/generate.py`: the configuration
tables, the quickstart, and the core and periphery with every module placed and counted), every relative link and
image in `docs/` and `README.md` points at a file that exists, and so does every docs page the code names
(`docs/<page>.md` in a docstring, a comment or a message of the package, the recipes, the examples or the
benchmarks). tests/README.md names only paths and modules that exist, and lists every test file."""

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
# [text](target) and ![alt](target), outside code; the target up to a space or the closing parenthesis
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
CODE_SPAN = re.compile(r"`[^`\n]*`")
# The Python files a user reads or runs; tests/ is left out, as its docstrings also name TRL's own docs pages.
SOURCES = sorted(
    p for folder in ("trl_multiagent", "recipes", "examples", "benchmarks") for p in (ROOT / folder).rglob("*.py")
)
DOCS_PAGE = re.compile(r"\bdocs/[\w./-]*?\.md\b")


def relative_targets(page: Path) -> list[str]:
    text = CODE_SPAN.sub("", FENCE.sub("", page.read_text(encoding="utf-8")))
    targets = [m.group(1) for m in LINK.finditer(text)]
    return [t for t in targets if not re.match(r"^[a-z][a-z0-9+.-]*:", t) and not t.startswith("#")]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_image_resolves(page):
    missing = [t for t in relative_targets(page) if not (page.parent / t.split("#")[0]).exists()]
    assert missing == [], f"{page.relative_to(ROOT)} links files that do not exist: {missing}"


def test_the_link_check_sees_a_missing_file(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("![a plot](img/none.png) [ok](page.md) `[not a link](x.md)` [web](https://example.org)\n")
    assert [t for t in relative_targets(page) if not (tmp_path / t).exists()] == ["img/none.png"]


def named_docs_pages(source: Path) -> list[str]:
    """The `docs/<page>.md` paths a Python file names, anywhere in its text (docstrings, comments, messages)."""
    return DOCS_PAGE.findall(source.read_text(encoding="utf-8"))


def test_every_docs_page_the_code_names_exists():
    # one test for every file, so that the suite's count does not grow with the package
    missing = {
        str(source.relative_to(ROOT)): pages
        for source in SOURCES
        if (pages := [page for page in named_docs_pages(source) if not (ROOT / page).is_file()])
    }
    assert missing == {}, f"Python files name docs pages that do not exist: {missing}"


def test_the_code_check_sees_a_missing_page(tmp_path):
    source = tmp_path / "module.py"
    source.write_text(
        '"""See docs/credit.md and docs/how-a-step-works.md."""\n'
        "# as docs/api/rollout.md says\n"
        "raise ValueError(\"read docs/vllm.md, 'vLLM on CPU'\")\n"
    )
    named = named_docs_pages(source)
    assert named == ["docs/credit.md", "docs/how-a-step-works.md", "docs/api/rollout.md", "docs/vllm.md"]
    assert [page for page in named if not (ROOT / page).is_file()] == ["docs/credit.md"]


def test_the_generated_parts_are_current():
    result = subprocess.run([sys.executable, "docs/generate.py", "--check"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def generate_module():
    """docs/generate.py as a module (a script, not in a package), for its functions."""
    spec = importlib.util.spec_from_file_location("docs_generate", ROOT / "docs" / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_layout_places_each_module_once_and_counts_its_lines(tmp_path):
    """docs/architecture.md's core and periphery: a module placed nowhere or twice, or a name that is gone, fails
    (as `--check` does, naming them); otherwise each module shows its lines, and each group and side its total."""
    generate = generate_module()
    package = tmp_path / "trl_multiagent"
    for name, count in {"__init__": 2, "trainer": 10, "update/__init__": 1, "update/batching": 5, "comlrl/__init__": 3,
                        "comlrl/trainer": 7, "comlrl/utils/__init__": 4, "update/new_feature": 6}.items():  # fmt: skip
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).with_suffix(".py").write_text("x = 1\n" * count)
    lines = generate.module_lines(package)
    assert lines == {"__init__": 2, "comlrl": 3, "comlrl.trainer": 7, "comlrl.utils": 4, "trainer": 10, "update": 1,
                     "update.batching": 5, "update.new_feature": 6}  # fmt: skip
    layout = {
        "core": {"step": ["__init__", "trainer", "update", "update.batching", "update.chunking"]},
        "periphery": {"face": ["comlrl/", "trainer"]},
    }
    with pytest.raises(generate.UnplacedModules) as refused:
        generate.placed(layout, lines)
    assert str(refused.value) == (
        "docs/generate.py's LAYOUT and trl_multiagent/ disagree: modules placed in neither the core nor the "
        "periphery: ['update.new_feature']; modules placed twice: {'trainer': ['step', 'face']}; names that are no "
        "module of the package: ['update.chunking']"
    )
    layout = {
        "core": {"step": ["__init__", "trainer", "update", "update.batching"]},
        "periphery": {"face": ["comlrl/"], "new": ["update.new_feature"]},
    }
    assert generate.layout_tables(generate.placed(layout, lines)).splitlines() == [
        "**The core**: 18 lines in 4 modules.",
        "",
        "| Group | Modules (lines) | Lines |",
        "| --- | --- | ---: |",
        "| step | `__init__` (2), `trainer` (10), `update` (1), `update.batching` (5) | 18 |",
        "",
        "**The periphery**: 20 lines in 4 modules.",
        "",
        "| Group | Modules (lines) | Lines |",
        "| --- | --- | ---: |",
        "| face | `comlrl` (3), `comlrl.trainer` (7), `comlrl.utils` (4) | 14 |",
        "| new | `update.new_feature` (6) | 6 |",
        "",
        "The package: 38 lines, 47% of them in the core.",
    ]


@pytest.mark.slow  # a run of its own, kept out of the default suite for time (docs/tests.md, "The default suite")
def test_a_stale_page_fails_the_check(tmp_path):
    """A copy of the repository's pages whose README quickstart changed: `--check` fails and names the page."""
    (tmp_path / "docs").mkdir()
    shutil.copy(ROOT / "docs" / "generate.py", tmp_path / "docs")
    for name in ("configuration.md", "quickstart.md", "architecture.md"):
        shutil.copy(ROOT / "docs" / name, tmp_path / "docs" / name)
    (tmp_path / "trl_multiagent").symlink_to(ROOT / "trl_multiagent")  # read only: its config and its line counts
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    (tmp_path / "README.md").write_text(readme.replace("## Quickstart\n", "## Quickstart\n\nA new line.\n", 1))
    check = [sys.executable, "docs/generate.py", "--check"]
    result = subprocess.run(check, cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 1 and "docs/quickstart.md" in result.stderr
    subprocess.run([sys.executable, "docs/generate.py"], cwd=tmp_path, check=True, capture_output=True)
    assert "A new line." in (tmp_path / "docs" / "quickstart.md").read_text()
    assert subprocess.run(check, cwd=tmp_path, capture_output=True).returncode == 0


# tests/README.md: a backticked path (with a `/` or a file's suffix) or `trl_multiagent.` module, and a test file
README_SPAN = re.compile(r"`([^`\n]+)`")
PATH_LIKE = re.compile(r"[\w.-]+(/[\w.-]*)+|[\w.-]+\.(py|txt|json|sh|md|toml)")
MODULE_LIKE = re.compile(r"[a-z_]\w*(\.\w+)*/?")
TEST_FILE = re.compile(r"test_\w+\.py")
FOLDERS = (ROOT / "tests", ROOT, ROOT / "trl_multiagent")  # where a path named in tests/README.md may be


def exists_as_module(name: str) -> bool:
    """`a.b` is trl_multiagent/a/b.py or the package trl_multiagent/a/b/; `a/` is the package trl_multiagent/a/, or a
    folder of the repository (`recipes/`)."""
    if name.endswith("/"):
        return (ROOT / "trl_multiagent" / name).is_dir() or (ROOT / name).is_dir()
    path = ROOT / "trl_multiagent" / Path(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def readme_problems(text: str, test_files: set[str]) -> list[str]:
    """What tests/README.md names that does not exist, and the test files it does not list."""
    problems = []
    for span in README_SPAN.findall(text):
        if span.startswith("trl_multiagent."):
            if not exists_as_module(span.removeprefix("trl_multiagent.")):
                problems.append(f"module `{span}` does not exist")
        elif PATH_LIKE.fullmatch(span) and not any((folder / span).exists() for folder in FOLDERS):
            problems.append(f"path `{span}` is in none of tests/, the repository's root, trl_multiagent/")
    for line in text.splitlines():  # a table row's first column: its modules, before the parenthesised description
        if line.startswith("| ") and not line.startswith(("| ---", "| module")):
            for span in README_SPAN.findall(line.split("|")[1].split("(")[0]):
                if MODULE_LIKE.fullmatch(span) and not exists_as_module(span):
                    problems.append(f"module `{span}` is not in trl_multiagent/ (nor a folder of the repository)")
    listed = set(TEST_FILE.findall(text))
    problems += [f"`{name}` is not listed" for name in sorted(test_files - listed)]
    return problems


def test_the_tests_readme_names_what_exists_and_lists_every_test_file():
    text = (ROOT / "tests" / "README.md").read_text(encoding="utf-8")
    test_files = {path.name for path in (ROOT / "tests").glob("test_*.py")}
    assert readme_problems(text, test_files) == []


def test_the_tests_readme_check_sees_gone_modules_and_unlisted_files():
    text = (
        "Tiny models come from `trl_multiagent.demo.testing`, and from `trl_multiagent.testing`.\n\n"
        "| module | tests |\n| --- | --- |\n"
        "| `compat/comlrl` (CoMLRL's names, `read_checkpoint_metadata`) | `test_comlrl_dropin.py` |\n"
        "| `rollout/` (`rollout.tree`, `rollout.credit`) | `test_credit.py`, `test_gone.py`, `comlrl_contract/` |\n"
        "| `credit.returns`, `rollout.credit` (`returns`) | `comlrl_examples/expected_failures.txt` |\n"
    )
    assert readme_problems(text, {"test_comlrl_dropin.py", "test_credit.py", "test_new.py"}) == [
        "module `trl_multiagent.testing` does not exist",
        "path `compat/comlrl` is in none of tests/, the repository's root, trl_multiagent/",
        "path `test_gone.py` is in none of tests/, the repository's root, trl_multiagent/",
        "module `rollout.credit` is not in trl_multiagent/ (nor a folder of the repository)",
        "`test_new.py` is not listed",
    ]
