"""The package's floors (docs/architecture.md): each module imports only from its own floor or the floors below,
the CoMLRL face (`comlrl/`) sits on top of the TRL face and its names are known there only (the TRL face's refusal of
one reads the face's table, which the package's `__init__` registers), and the core imports none of the demo tooling nor
of the CoMLRL face, nor names either in a string (an `importlib` spec or a `module:function` default)."""

import ast
import pathlib
import re

import pytest


PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "trl_multiagent"
# Bottom to top; a module belongs to the longest prefix listed. `demo` and the two command shims sit outside.
FLOORS = [
    ["devices", "timing", "flags", "model_card", "prepared_models", "embedded_model", "callables", "generation.output"]
    + ["keywords"]
    + ["trl_release"]
    + ["credit", "critic", "environments", "rewards"],  # plain Python: each folder here is floor 0 as a whole
    ["team", "update", "generation.limits"],
    ["generation"],
    ["rollout"],
    ["metrics", "distributed", "checkpoint", "diagnostics", "environment_lifecycle", "trees"],
    ["config"],
    ["arguments"],
    ["trainer"],
    ["comlrl"],  # the CoMLRL face: subclasses of the TRL face's config and trainer
    ["evaluation", "view"],  # the commands `python -m trl_multiagent.evaluation` and `.view`: anything below
    [""],  # the package's __init__
]
OUTSIDE = ("demo", "models", "plot")
# CoMLRL's names that only its face (`comlrl/`) may know: its reward keyword, its trainer's and its config's own
COMLRL_NAMES = re.compile(
    r"\b(batch_items|processor|reward_processor|agent_model|wandb_config|eval_logger|eval_aggregator|"
    r"agent_learning_rate|rollout_buffer_size|advantage_mode|advantage_normalization|eval_interval|eval_num_samples|"
    r"external_prompt_passthrough|parallel_training|agent_devices|reference_devices|reference_kl_enabled|"
    r"reference_kl_coef)\b"
)


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def floor_of(module: str) -> int:
    best, floor = -1, None
    for level, prefixes in enumerate(FLOORS):
        for prefix in prefixes:
            if (prefix == "" or module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, floor = len(prefix), level
    return floor


def internal_imports(module: str, source: str, is_package: bool) -> set[str]:
    """The package modules that `source` (the module `module`) imports, relative imports resolved."""
    package = [p for p in (module.split(".") if is_package else module.split(".")[:-1]) if p]
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level:
            target = ".".join([*package[: len(package) - (node.level - 1)], *([node.module] if node.module else [])])
            if node.module:
                found.add(target)
            else:  # `from . import x`: x is a module
                found.update(f"{target}.{alias.name}".strip(".") for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("trl_multiagent"):
            found.add(node.module.removeprefix("trl_multiagent").strip("."))
        elif isinstance(node, ast.Import):
            found.update(
                alias.name.removeprefix("trl_multiagent").strip(".")
                for alias in node.names
                if alias.name.startswith("trl_multiagent.")
            )
    return found


def violations(module: str, source: str, is_package: bool = False) -> list[str]:
    if module.split(".")[0] in OUTSIDE:
        return []
    found = []
    for target in sorted(internal_imports(module, source, is_package)):
        if target.split(".")[0] in OUTSIDE:
            found.append(f"{module} (core) imports the demo tooling ({target})")
        elif floor_of(target) > floor_of(module):
            found.append(f"{module} (floor {floor_of(module)}) imports {target} (floor {floor_of(target)})")
    return found


MODULES = sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=module_name)
def test_imports_go_down_only(path):
    assert floor_of(module_name(path)) is not None
    assert violations(module_name(path), path.read_text(), path.name == "__init__.py") == []


@pytest.mark.parametrize(
    ("module", "line", "found"),
    [
        ("rollout.tree", "from ..trainer import MAGRPOTrainer", "floor 3) imports trainer (floor 7)"),
        ("checkpoint", "from .demo.models import HUB_ID", "imports the demo tooling"),
        ("trainer", "from .comlrl import MAGRPOTrainer", "floor 7) imports comlrl (floor 8)"),
        ("keywords", "from .comlrl.names import NAMES", "floor 0) imports comlrl.names (floor 8)"),
        ("config", "import trl_multiagent.comlrl.names", "floor 5) imports comlrl.names (floor 8)"),
        ("comlrl.names", "from ..keywords import FaceNames", None),  # the face registers its table below it
        ("generation.vllm_colocate", "from ..credit.returns import joint_choices", None),  # floor 0: allowed
        ("generation.base", "from ..rollout.tree import Node", "imports rollout.tree"),
        ("evaluation.runs", "from .statistics import mean_ci", None),  # within floor 9: allowed
        ("evaluation.runs", "from ..trainer import MAGRPOTrainer", None),
        ("trainer", "from .evaluation.statistics import mean_ci", "floor 7) imports evaluation.statistics (floor 9)"),
        ("evaluation.task", "from ..demo.examples import HELD_OUT_PROMPTS", "imports the demo tooling"),
    ],
)
def test_the_check_finds_a_back_edge(module, line, found):
    result = violations(module, line)
    assert (result == []) if found is None else (len(result) == 1 and found in result[0]), result


@pytest.mark.parametrize("path", MODULES, ids=module_name)
def test_only_the_comlrl_face_knows_comlrls_names(path):
    module = module_name(path)
    if module.split(".")[0] not in ("comlrl", *OUTSIDE):
        assert COMLRL_NAMES.findall(path.read_text()) == [], module


def test_the_architecture_page_names_every_module():
    page = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    for path in MODULES:
        module = module_name(path)
        if path.name != "__init__.py":
            assert f"`{module}`" in page, module  # by its full name: a last segment could name another module


DEMO_MODULE = re.compile(r"trl_multiagent\.demo\b")
COMLRL_MODULE = re.compile(r"trl_multiagent\.comlrl\b|^\.+comlrl\b")  # absolute, or relative (`importlib`'s package=)


def demo_names(source: str, module: re.Pattern = DEMO_MODULE) -> list[str]:
    """The strings of `source`, docstrings left out, that name a `module` (a demo module): the demo tooling reached by
    name (`importlib`, a `module:function` default) instead of by an import."""
    tree = ast.parse(source)
    documented = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, documented) and node.body and isinstance(node.body[0], ast.Expr)
    }
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
        if module.search(node.value)
    ]


@pytest.mark.parametrize("path", MODULES, ids=module_name)
def test_the_core_names_no_demo_module(path):
    if module_name(path).split(".")[0] not in OUTSIDE:
        assert demo_names(path.read_text()) == []


@pytest.mark.parametrize("path", MODULES, ids=module_name)
def test_below_the_comlrl_face_no_module_names_it(path):
    """An `importlib` spec naming the CoMLRL face would be an import up the floors that the import check misses;
    only the package's `__init__`, above every face, registers the face's table (a relative spec)."""
    module = module_name(path)
    if module.split(".")[0] not in OUTSIDE and floor_of(module) < floor_of("comlrl"):
        assert demo_names(path.read_text(), COMLRL_MODULE) == [], module


def test_the_name_check_sees_a_demo_task_named_as_a_string():
    source = '"""Docs may name trl_multiagent.demo.examples."""\nTASK = {"reward": "trl_multiagent.demo.examples:r"}\n'
    assert demo_names(source) == ["trl_multiagent.demo.examples:r"]
    assert demo_names('spec = f"trl_multiagent.demo.examples:{name}"\n') == ["trl_multiagent.demo.examples:"]
    face = 'import importlib\nNAMES = importlib.import_module(".comlrl.names", __package__).NAMES\n'
    assert demo_names(face, COMLRL_MODULE) == [".comlrl.names"]
    assert demo_names('DOCS = "docs/from_comlrl.md"\n', COMLRL_MODULE) == []
