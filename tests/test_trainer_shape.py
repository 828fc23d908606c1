"""The trainer subclass stays thin glue: at most 400 lines, and its docstring names every GRPOTrainer method it (or a
mixin of it) overrides, so that a reader sees in one place what differs from GRPOTrainer."""

import inspect
from pathlib import Path

from trl import GRPOTrainer

import trl_multiagent.trainer
from trl_multiagent import MAGRPOTrainer


def overrides() -> dict[str, str]:
    """GRPOTrainer's (and Trainer's) methods that MAGRPOTrainer or one of its mixins defines again: name -> class."""
    found = {}
    for cls in MAGRPOTrainer.__mro__[: MAGRPOTrainer.__mro__.index(GRPOTrainer)]:
        for name, value in vars(cls).items():
            method = callable(value) or isinstance(value, (property, staticmethod, classmethod))
            if method and not name.startswith("__") and hasattr(GRPOTrainer, name):
                found.setdefault(name, cls.__name__)
    return found


def test_trainer_module_is_at_most_400_lines():
    lines = Path(inspect.getsourcefile(trl_multiagent.trainer)).read_text().count("\n")
    assert lines <= 400, f"trl_multiagent/trainer.py has {lines} lines; move logic into the modules below it"


def test_the_docstring_names_every_grpotrainer_override():
    found = overrides()
    assert {"_generate_and_score_completions", "compute_loss", "_save"} <= found.keys()  # the lookup sees mixins
    missing = {name: cls for name, cls in found.items() if f"`{name}`" not in MAGRPOTrainer.__doc__}
    assert not missing, f"MAGRPOTrainer's docstring does not list these overrides (name: defined in): {missing}"
