"""The docs' generated parts, written into the pages so that each page reads correctly as a file (on a code host, or
offline), not only on the built site.

- `docs/configuration.md`: the table of the fields `MAGRPOConfig` adds, and of the `GRPOConfig` fields it declares
  again with another default or help text, from the dataclass metadata (the same `help` text `--help` prints);
- `docs/quickstart.md`: the README's `## Quickstart` section, as `tests/test_quickstart.py` runs it;
- `docs/architecture.md`: the core and the periphery, each module with its line count, from `LAYOUT` below; a module
  of `trl_multiagent/` that `LAYOUT` does not place, or a name there that is gone, is an error (`--check` exits 1).

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


# Every module of trl_multiagent/, in the core (what one training step needs) or in the periphery (what a step runs
# without), by group. A module is named dotted, from the package (`update.batching`; a package's `__init__.py` by the
# package's name, `update`; the package's own `__init__`); a name ending in `/` places a whole package. The core
# names its modules one by one, so that a module added to a core package is placed by a decision, not by default.
LAYOUT: dict[str, dict[str, list[str]]] = {
    "core": {
        "config": ["__init__", "config", "keywords", "devices"],
        "arguments": [
            "arguments", "arguments.datasets", "arguments.environments", "arguments.first_rows", "arguments.functions",
            "arguments.grpo", "arguments.learning_rates",
        ],
        "trainer": ["trainer", "checkpoint", "distributed", "metrics", "timing"],
        "rollout": ["rollout", "rollout.tree", "rollout.task", "callables"],
        "credit": ["credit", "credit.returns", "credit.options"],
        "rewards": [
            "rewards", "rewards.joint", "rewards.wrappers", "rewards.signatures", "rewards.values", "rewards.models",
            "rewards.log_extra",
        ],
        "update": [
            "update", "update.batching", "update.chunking", "update.prefix", "update.importance", "update.entropy",
            "update.loss_call",
        ],
        "team": [
            "team", "team.agent_team", "team.assembly", "team.model_config", "team.optimizer", "team.reference_sync",
        ],
        "generation": [
            "generation", "generation.base", "generation.factory", "generation.hf", "generation.limits",
            "generation.output",
        ],
    },
    "periphery": {
        "the CoMLRL face": ["comlrl/"],
        "evaluation": ["evaluation/"],
        "demo and its commands": ["demo/", "models", "plot", "flags"],
        "viewer and trees": ["view/", "trees/"],
        "environments and tools": ["environments/", "environment_lifecycle", "rollout.tools"],
        "vLLM back-ends": [
            "generation.vllm_base", "generation.vllm_colocate", "generation.vllm_server", "generation.vllm_settings",
            "generation.vllm_process", "generation.vllm_cpu",
        ],
        "saved teams' cards, prepared models": ["model_card", "prepared_models", "embedded_model"],
        "diagnostics": ["diagnostics"],
        "a learned critic (the CoMLRL face's IAC and MAAC)": ["critic/"],
        "TRL 1.15": ["trl_release"],
    },
}  # fmt: skip


class UnplacedModules(ValueError):
    """The package and `LAYOUT` disagree: a module placed nowhere (or twice), or a name of `LAYOUT` that is gone."""


def module_lines(package: Path) -> dict[str, int]:
    """Each module of `package`, named as in `LAYOUT`, -> its number of lines."""
    lines = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package).with_suffix("").parts
        if parts[-1] == "__init__" and len(parts) > 1:
            parts = parts[:-1]
        lines[".".join(parts)] = len(path.read_text(encoding="utf-8").splitlines())
    return lines


def placed(layout: dict[str, dict[str, list[str]]], lines: dict[str, int]) -> dict[tuple[str, str], dict[str, int]]:
    """(side, group) -> {module: lines}, each module of `lines` in exactly one group; `UnplacedModules` otherwise."""
    groups, where, gone = {}, {}, []
    for side, side_groups in layout.items():
        for group, names in side_groups.items():
            members = {}
            for name in names:
                if name.endswith("/"):
                    package = name[:-1]
                    found = [m for m in lines if m == package or m.startswith(package + ".")]
                else:
                    found = [name] if name in lines else []
                if not found:
                    gone.append(name)
                for module in found:
                    members[module] = lines[module]
                    where.setdefault(module, []).append(group)
            groups[side, group] = members
    unplaced = sorted(module for module in lines if module not in where)
    twice = {module: places for module, places in where.items() if len(places) > 1}
    if unplaced or twice or gone:
        raise UnplacedModules(
            "docs/generate.py's LAYOUT and trl_multiagent/ disagree: "
            + "; ".join(
                text
                for text in (
                    unplaced and f"modules placed in neither the core nor the periphery: {unplaced}",
                    twice and f"modules placed twice: {twice}",
                    gone and f"names that are no module of the package: {gone}",
                )
                if text
            )
        )
    return groups


def layout_tables(groups: dict[tuple[str, str], dict[str, int]]) -> str:
    """One table per side: each group's modules with their lines, the group's total; then the totals."""
    text, totals = [], {}
    for side, title in (("core", "The core"), ("periphery", "The periphery")):
        rows = [(group, members) for (group_side, group), members in groups.items() if group_side == side]
        totals[side] = sum(sum(members.values()) for _, members in rows), sum(len(members) for _, members in rows)
        text += [
            f"**{title}**: {totals[side][0]:,} lines in {totals[side][1]} modules.",
            "",
            "| Group | Modules (lines) | Lines |",
            "| --- | --- | ---: |",
        ]
        for group, members in rows:
            modules = ", ".join(f"`{module}` ({count})" for module, count in members.items())
            text.append(f"| {group} | {modules} | {sum(members.values()):,} |")
        text.append("")
    core, periphery = totals["core"][0], totals["periphery"][0]
    text.append(f"The package: {core + periphery:,} lines, {core / (core + periphery):.0%} of them in the core.")
    return "\n".join(text)


def generated_parts() -> dict[str, dict[str, str]]:
    """Page -> {part name: its text}."""
    own, changed = config_fields()
    return {
        "docs/configuration.md": {"config-fields": wrapped(table(own)), "changed-fields": wrapped(table(changed))},
        "docs/quickstart.md": {"readme-quickstart": readme_quickstart()},
        "docs/architecture.md": {
            "core-and-periphery": layout_tables(placed(LAYOUT, module_lines(ROOT / "trl_multiagent")))
        },
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
    # The pages document this checkout's package, not whichever copy is installed (an editable install of another one)
    sys.path.insert(0, str(ROOT))
    try:
        pages = generated_parts()
    except UnplacedModules as error:
        print(error, file=sys.stderr)
        return 1
    stale = []
    for name, parts in pages.items():
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
    print(("rewrote " if stale else "current: ") + ", ".join(stale or pages))
    return 0


if __name__ == "__main__":
    sys.exit(main())
