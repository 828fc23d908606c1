"""A Griffe extension that lets mkdocstrings render the package's docstrings as they are written.

The docstrings stay untouched in the source; only the copy Griffe hands to mkdocstrings is rewritten:

- bare doctests (`>>>` lines and their output, outside a code fence) become ```` ```pycon ```` blocks, so that Markdown
  does not read `>>>` as three nested block quotes;
- Hugging Face style parameter types, `` name (`float` or `None`, *optional*, defaults to `-0.2`): ``, become the
  Google style type, ``name (float | None):`` (the default is shown from the signature);
- TRL's group headings inside a Parameters section (`> Parameters that control generation`, and the blank line after
  one) are left out: a Google style section has no headings, and Griffe would read one as a parameter without a type;
- Hugging Face doc-builder links, `` [`MAGRPOTrainer`] `` and `` [`~trl.GRPOConfig`] ``, become links to this package's
  API pages when they name one of its public objects, and inline code otherwise.

Loaded from `mkdocs.yml` (`plugins: mkdocstrings: handlers: python: options: extensions`).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import griffe


PACKAGE = "trl_multiagent"
_INIT = Path(__file__).resolve().parents[2] / PACKAGE / "__init__.py"

_FENCE = re.compile(r"^\s*(```|~~~)")
_HF_PARAMETER = re.compile(
    r"^(?P<indent>\s*)(?P<name>\*{0,2}\w+) \((?P<type>[^()]*\*optional\*[^()]*|`[^()]*`)\):(?P<rest>.*)$"
)
_GROUP_HEADING = re.compile(r"^\s*> Parameters that control ")
_HF_LINK = re.compile(r"\[`(?P<tilde>~?)(?P<path>[\w.]+)`\](?![\[(])")


def _public_names() -> set[str]:
    """`__all__` of the package, read without importing it (importing pulls in torch and TRL)."""
    tree = ast.parse(_INIT.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    return set()


PUBLIC = _public_names()


def hf_type(text: str) -> str:
    """`` `float` or `None`, *optional*, defaults to `-0.2` `` -> ``float | None``."""
    kind = re.split(r",\s*\*optional\*", text, maxsplit=1)[0]
    kind = kind.split(", defaults to", 1)[0]
    return " | ".join(part.strip().strip("`") for part in kind.split(" or "))


def hf_link(match: re.Match) -> str:
    path = match["path"]
    name = path.rsplit(".", 1)[-1]
    if path.startswith(f"{PACKAGE}."):
        return f"[`{name if match['tilde'] else path}`][{path}]"
    if "." not in path and path in PUBLIC:
        return f"[`{path}`][{PACKAGE}.{path}]"
    return f"`{name if match['tilde'] else path}`"


def fence_doctests(lines: list[str]) -> list[str]:
    """Wrap each run of doctest lines (a `>>>` line up to the next blank line) outside a code fence in a pycon fence."""
    out: list[str] = []
    in_fence = False
    i = 0
    while i < len(lines):
        line = lines[i]
        if _FENCE.match(line):
            in_fence = not in_fence
            out.append(line)
            i += 1
            continue
        if not in_fence and line.lstrip().startswith(">>>"):
            indent = line[: len(line) - len(line.lstrip())]
            block = []
            while i < len(lines) and lines[i].strip():
                block.append(lines[i])
                i += 1
            if out and out[-1].strip():
                out.append("")
            out.append(f"{indent}```pycon")
            out.extend(block)
            out.append(f"{indent}```")
            if i < len(lines):
                out.append("")
            continue
        out.append(line)
        i += 1
    return out


def drop_group_headings(lines: list[str]) -> list[str]:
    """The lines without TRL's `> Parameters that control ...` headings, nor the blank line after each."""
    out: list[str] = []
    for line in lines:
        if out and _GROUP_HEADING.match(out[-1]) and not line.strip():
            out.pop()
            continue
        out.append(line)
    return [line for line in out if not _GROUP_HEADING.match(line)]


def rewrite(text: str) -> str:
    lines = fence_doctests(drop_group_headings(text.split("\n")))
    in_fence = False
    for index, line in enumerate(lines):
        if _FENCE.match(line):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        parameter = _HF_PARAMETER.match(line)
        if parameter:
            line = f"{parameter['indent']}{parameter['name']} ({hf_type(parameter['type'])}):{parameter['rest']}"
        lines[index] = _HF_LINK.sub(hf_link, line)
    return "\n".join(lines)


class RenderDocstringsAsWritten(griffe.Extension):
    """Rewrites each docstring's rendered copy (see the module docstring)."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None and obj.docstring.value:
            obj.docstring.value = rewrite(obj.docstring.value)
