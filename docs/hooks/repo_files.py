"""MkDocs hook: what the site takes from the rest of the repository, so that it is written in one place only.

- The benchmark plots (`benchmarks/learning/*.png`, which the README links from the repository root) are served as
  `img/<name>.png`: pages link `img/main_job_rewards.png`, and nothing is copied into `docs/`.
- `<!-- README_QUICKSTART -->` becomes the body of the README's `## Quickstart` section, taken as
  `tests/test_quickstart.py` takes it (the text up to the next `## ` heading), so the page shows the code the test runs.
"""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.structure.files import File


ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
IMAGES = ROOT / "benchmarks" / "learning"
QUICKSTART = "<!-- README_QUICKSTART -->"


def readme_quickstart() -> str:
    text = README.read_text(encoding="utf-8")
    section = re.search(r"^## Quickstart\n(.*?)(?=^## )", text, re.S | re.M)
    if section is None:
        raise ValueError("README.md has no '## Quickstart' section followed by another '## ' section")
    return section.group(1).strip() + "\n"


def on_files(files, config):
    for image in sorted(IMAGES.glob("*.png")):
        files.append(File.generated(config, f"img/{image.name}", abs_src_path=str(image)))
    return files


def on_page_markdown(markdown, page, config, files):
    if QUICKSTART in markdown:
        markdown = markdown.replace(QUICKSTART, readme_quickstart())
    return markdown


def on_serve(server, config, builder):
    server.watch(str(README))
    server.watch(str(IMAGES))
    return server
