"""The trainer's docstring names every GRPOTrainer method it (or a mixin of it) overrides, so that a reader sees in one
place what differs from GRPOTrainer; the CoMLRL face's names every method of the TRL face it overrides. (Its length is
no measure: issue 48 lifted the 400-line cap.)"""

from trl import GRPOTrainer

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


def test_the_comlrl_face_names_every_method_of_the_trl_face_it_overrides():
    from trl_multiagent.comlrl import MAGRPOTrainer as CoMLRLTrainer

    own = [name for name, value in vars(CoMLRLTrainer).items() if callable(value) and hasattr(MAGRPOTrainer, name)]
    assert "__init__" in own and "_prepare_arguments" in own
    missing = [name for name in own if f"`{name}`" not in CoMLRLTrainer.__doc__]
    assert not missing, f"the CoMLRL face's docstring does not list these overrides: {missing}"


def test_the_docstring_names_every_grpotrainer_override():
    found = overrides()
    assert {"_generate_and_score_completions", "compute_loss", "_save"} <= found.keys()  # the lookup sees mixins
    missing = {name: cls for name, cls in found.items() if f"`{name}`" not in MAGRPOTrainer.__doc__}
    assert not missing, f"MAGRPOTrainer's docstring does not list these overrides (name: defined in): {missing}"
