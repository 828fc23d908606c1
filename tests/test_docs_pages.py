"""Every docs page reads correctly as a file: its generated parts are current (`docs/generate.py`), and every relative
link and image in `docs/` and `README.md` points at a file that exists."""

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
