"""Every docs page reads correctly as a file: its generated parts are current (`docs/generate.py`), every relative
link and image in `docs/` and `README.md` points at a file that exists, and so does every docs page the code names
(`docs/<page>.md` in a docstring, a comment or a message of the package, the recipes, the examples or the benchmarks)."""

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


def test_a_stale_page_fails_the_check(tmp_path):
    """A copy of the repository's pages whose README quickstart changed: `--check` fails and names the page."""
    (tmp_path / "docs").mkdir()
    shutil.copy(ROOT / "docs" / "generate.py", tmp_path / "docs")
    for name in ("configuration.md", "quickstart.md"):
        shutil.copy(ROOT / "docs" / name, tmp_path / "docs" / name)
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    (tmp_path / "README.md").write_text(readme.replace("## Quickstart\n", "## Quickstart\n\nA new line.\n", 1))
    check = [sys.executable, "docs/generate.py", "--check"]
    result = subprocess.run(check, cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 1 and "docs/quickstart.md" in result.stderr
    subprocess.run([sys.executable, "docs/generate.py"], cwd=tmp_path, check=True, capture_output=True)
    assert "A new line." in (tmp_path / "docs" / "quickstart.md").read_text()
    assert subprocess.run(check, cwd=tmp_path, capture_output=True).returncode == 0
