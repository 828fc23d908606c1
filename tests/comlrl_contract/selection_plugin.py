"""Pytest plugin that run_comlrl_tests.py copies into each run folder (as `_comlrl_contract_selection.py`): it keeps
the tests that use the classes under test (the names `_magrpo_under_test` exports: MAGRPO's, its REINFORCE family's
and the actor-critics' (IAC, MAAC) configs and trainers, and the centralized adapter's names) and deselects the
others, then writes the kept ids to the JSON file `COMLRL_CONTRACT_SELECTED`.

A test uses them when the code it runs, read from the copied test files, names them:
- one of its parameters is one of the classes, or a function or class of the test files that names them or (a class)
  subclasses one of the configs or trainers; CoMLRL's other subclasses, such as its preference trainers, are not the
  classes under test, nor is a subclass of the adapter (CoMLRL's preference tests subclass it too);
  (so `test_config_rejects_invalid_field[MAGRPOConfig(...)]` is kept and its `MADPOConfig` cases are not);
- or, when no parameter of the function varies between such a value and another library's (those variants are the
  other library's tests), the test function names them, directly or through the functions and classes of the test
  files that it names, transitively (read with `ast` from their source; a name is looked up where the code looks it
  up: the function's globals);
- except the cases listed in `OTHER_TRAINER_CASES`, whose parameter value picks another CoMLRL trainer.

Fixtures are not read: none of CoMLRL 1.4.3's fixtures names the classes (run_comlrl_tests.py's README says so).
"""

import ast
import inspect
import json
import os
import sys
from pathlib import Path


UNDER_TEST = "_magrpo_under_test"
DERIVED_FROM = ("Config", "Trainer")  # a test file's subclass of a class under test uses it when its name ends so
# Parameter values whose cases run another CoMLRL trainer instead of the classes under test, where the value is not
# that class (so the rule on class-valued parameters cannot tell): test_joint_policy.py's `learned_reward=True` cases
# build CoMLRL's MARLHFTrainer (helpers.make_preference_trainer), its False cases CentralizedMAGRPOTrainer.
OTHER_TRAINER_CASES = {"learned_reward": True}


class _Reader:
    def __init__(self, targets, tests_dir):
        self.targets = targets
        self.bases = tuple(t for t in targets if t.__name__.endswith(DERIVED_FROM))
        self.tests_dir = tests_dir
        self.memo = {}

    def _in_tests(self, obj):
        try:
            source = inspect.getsourcefile(obj)
        except TypeError:
            return False
        return source is not None and Path(source).resolve().is_relative_to(self.tests_dir)

    def _derives(self, cls):
        """A class of the test files derived from the configs or trainers under test through classes of the test
        files only (a subclass of CoMLRL's own subclasses, such as its MARLHFTrainer, does not use the classes under
        test)."""
        return any(
            any(base is target for target in self.bases) or (self._in_tests(base) and self._derives(base))
            for base in cls.__bases__
        )

    def names_targets(self, obj):
        if isinstance(obj, (list, tuple, set, frozenset)):
            return any(self.names_targets(value) for value in obj)
        if isinstance(obj, dict):
            return any(self.names_targets(value) for value in obj.values())
        if any(obj is target for target in self.targets):
            return True
        if not (inspect.isfunction(obj) or inspect.isclass(obj)) or not self._in_tests(obj):
            return False
        if inspect.isclass(obj) and self._derives(obj):
            return True  # a subclass written in the test files (e.g. a trainer double with scripted steps)
        key = id(obj)
        if key in self.memo:
            return self.memo[key]
        self.memo[key] = False  # a cycle reads as "does not name them" until proven otherwise
        scope = obj.__globals__ if inspect.isfunction(obj) else vars(sys.modules[obj.__module__])
        definition = ast.parse(inspect.cleandoc("\n" + inspect.getsource(obj))).body[0]
        # A class's own body, not its bases: a base that names the classes (in an isinstance check, say) is shared
        # with the other library's doubles, which do not use them.
        read = definition.body if isinstance(definition, ast.ClassDef) else [definition]
        names = {node.id for part in read for node in ast.walk(part) if isinstance(node, ast.Name)}
        found = any(name in scope and scope[name] is not obj and self.names_targets(scope[name]) for name in names)
        self.memo[key] = found
        return found


def pytest_collection_modifyitems(session, config, items):
    under_test = sys.modules.get(UNDER_TEST)
    if under_test is None:
        raise RuntimeError(f"comlrl_contract: no test file imported {UNDER_TEST} (the harness's edit did not apply)")
    reader = _Reader(tuple(getattr(under_test, name) for name in under_test.__all__), config.rootpath / "tests")
    params = {item.nodeid: getattr(getattr(item, "callspec", None), "params", {}) for item in items}
    using_params = {i: {name for name, value in p.items() if reader.names_targets(value)} for i, p in params.items()}
    # Per test function: the parameters whose values sort its cases into this library's and another's.
    sorting = {}
    for item in items:
        sorting.setdefault(item.function, set()).update(using_params[item.nodeid])
    kept, dropped = [], []
    for item in items:
        if any(OTHER_TRAINER_CASES.get(name, object()) is value for name, value in params[item.nodeid].items()):
            keep = False
        elif using_params[item.nodeid]:
            keep = True
        elif sorting[item.function]:
            keep = False  # its value of a sorting parameter is another library's class
        else:
            keep = reader.names_targets(item.function)
        (kept if keep else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
    path = os.environ.get("COMLRL_CONTRACT_SELECTED")
    if path:
        ids = [item.nodeid.removeprefix("tests/") for item in kept]
        Path(path).write_text(json.dumps(ids, indent=1))
