"""MkDocs hook: the configuration page's field tables, generated from `MAGRPOConfig`'s dataclass metadata.

`<!-- MAGRPO_CONFIG_FIELDS -->` becomes a table of the fields `MAGRPOConfig` declares itself (those `trl.GRPOConfig`
does not have), and `<!-- MAGRPO_CONFIG_CHANGED_FIELDS -->` a table of the `GRPOConfig` fields it declares again with
another default or help text. Each row: the name and type, the default and the `help` text of `field.metadata`, which
is also what `--help` of the recipes prints. The tables follow the code, so they cannot drift from it.
"""

from __future__ import annotations

import dataclasses
import re


OWN = "<!-- MAGRPO_CONFIG_FIELDS -->"
CHANGED = "<!-- MAGRPO_CONFIG_CHANGED_FIELDS -->"

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


def on_page_markdown(markdown, page, config, files):
    if OWN not in markdown and CHANGED not in markdown:
        return markdown
    own, changed = config_fields()
    return markdown.replace(OWN, wrapped(table(own))).replace(CHANGED, wrapped(table(changed)))


def wrapped(text: str) -> str:
    """In a `config-fields` block (`md_in_html`), which `docs/stylesheets/extra.css` keeps from breaking names."""
    return f'<div class="config-fields" markdown>\n\n{text}\n\n</div>'
