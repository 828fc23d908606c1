"""The docs' generated parts, written into the pages so that each page reads correctly as a file (on a code host, or
offline), not only on the built site.

- `docs/configuration.md`: the table of the fields `MAGRPOConfig` adds, and of the `GRPOConfig` fields it declares
  again with another default or help text, from the dataclass metadata (the same `help` text `--help` prints);
- `docs/quickstart.md`: the README's `## Quickstart` section, as `tests/test_quickstart.py` runs it.

Each generated part sits between `<!-- BEGIN GENERATED: name -->` and `<!-- END GENERATED: name -->`.

    python docs/generate.py           # rewrite the generated parts
    python docs/generate.py --check   # exit 1, naming the stale pages, when a page differs (CI and the tests run it)
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
# The pages document this checkout's package, not whichever copy is installed (an editable install of another one)
sys.path.insert(0, str(ROOT))

_CODE_SPAN = re.compile(r"(`[^`]*`)")


def markdown_text(text: str) -> str:
    """Plain help text as one table cell: argparse's `%%` unescaped, and `*`, `_`, `<`, `[`, `|` escaped outside
    code spans."""
    text = " ".join(text.replace("%%", "%").split())
    parts = _CODE_SPAN.split(text)
    for index, part in enumerate(parts):
        if index % 2 == 0:  # outside a code span
            part = part.replace("\\", "\\\\")
            for char in "*_<[|":
                part = part.replace(char, "\\" + char)
        parts[index] = part  # a code span keeps its `|`: the table extension does not split cells inside code
    return "".join(parts)


def default_of(field: dataclasses.Field) -> str:
    if field.default is not dataclasses.MISSING:
        value = field.default
    elif field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
    else:
        return "required"
    return f'`"{value}"`' if isinstance(value, str) else f"`{value!r}`"


def row(field: dataclasses.Field) -> str:
    help_text = markdown_text(field.metadata.get("help", ""))
    choices = field.metadata.get("choices")
    if choices:
        help_text += " One of " + ", ".join(f'`"{choice}"`' for choice in choices) + "."
    return f"| `{field.name}`<br>`{field.type}` | {default_of(field)} | {help_text} |"


def table(fields: list[dataclasses.Field]) -> str:
    lines = ["| Field and type | Default | Help (as `--help` prints it) |", "| --- | --- | --- |"]
    lines += [row(field) for field in fields]
    return "\n".join(lines)


def config_fields() -> tuple[list[dataclasses.Field], list[dataclasses.Field]]:
    from trl import GRPOConfig

    from trl_multiagent import MAGRPOConfig

    inherited = {field.name: field for field in dataclasses.fields(GRPOConfig)}
    own, changed = [], []
    for field in dataclasses.fields(MAGRPOConfig):
        base = inherited.get(field.name)
        if base is None:
            own.append(field)
        elif default_of(field) != default_of(base) or field.metadata.get("help") != base.metadata.get("help"):
            changed.append(field)
    return own, changed


def wrapped(text: str) -> str:
    """In a `config-fields` block (`md_in_html`), which `docs/stylesheets/extra.css` keeps from breaking names."""
    return f'<div class="config-fields" markdown>\n\n{text}\n\n</div>'


def readme_quickstart() -> str:
    """The body of the README's `## Quickstart` section (up to the next `## ` heading), as the test takes it."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = re.search(r"^## Quickstart\n(.*?)(?=^## )", text, re.S | re.M)
    if section is None:
        raise ValueError("README.md has no '## Quickstart' section followed by another '## ' section")
    return section.group(1).strip()


def generated_parts() -> dict[str, dict[str, str]]:
    """Page -> {part name: its text}."""
    own, changed = config_fields()
    return {
        "docs/configuration.md": {"config-fields": wrapped(table(own)), "changed-fields": wrapped(table(changed))},
        "docs/quickstart.md": {"readme-quickstart": readme_quickstart()},
    }


def filled(page: str, parts: dict[str, str]) -> str:
    for name, text in parts.items():
        begin, end = f"<!-- BEGIN GENERATED: {name} -->", f"<!-- END GENERATED: {name} -->"
        pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.S)
        if not pattern.search(page):
            raise ValueError(f"the page has no {begin} ... {end} block")
        block = f"{begin}\n\n{text}\n\n{end}"
        page = pattern.sub(lambda _, block=block: block, page)  # a function: the text is taken as it is
    return page


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="fail when a page's generated part is stale")
    check = parser.parse_args(argv).check
    stale = []
    for name, parts in generated_parts().items():
        path = ROOT / name
        current = path.read_text(encoding="utf-8")
        new = filled(current, parts)
        if new != current:
            stale.append(name)
            if not check:
                path.write_text(new, encoding="utf-8")
    if check and stale:
        print(f"stale generated parts in {stale}: run `python docs/generate.py`", file=sys.stderr)
        return 1
    print(("rewrote " if stale else "current: ") + ", ".join(stale or generated_parts()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
