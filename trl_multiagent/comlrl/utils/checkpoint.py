"""CoMLRL's `comlrl.utils.checkpoint`.

Its one public name, `read_checkpoint_metadata`, belongs here: the comlrl-examples work of issue 57 provides it (and
removes it from `not_provided.NOT_PROVIDED`); until then it raises `NotProvidedError`, naming it.
"""

from ..not_provided import module_getattr


__all__: list[str] = []
__getattr__ = module_getattr(__name__, "utils.checkpoint")
