"""The examples in the package's docstrings run, and give what they show."""

import doctest
import importlib
import pkgutil

import pytest

import trl_multiagent


MODULES = [m.name for m in pkgutil.walk_packages(trl_multiagent.__path__, "trl_multiagent.")]


def test_every_module_is_collected():
    assert {"trl_multiagent.update.importance", "trl_multiagent.credit.returns", "trl_multiagent.config"} <= set(
        MODULES
    )


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(
        importlib.import_module(name), optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    )
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"
