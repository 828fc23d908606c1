"""CoMLRL's `comlrl.schedulers` (placing agents on devices): not provided; each name raises `NotProvidedError`. Here
each process holds the whole team (docs/multi-gpu.md)."""

from ..not_provided import module_getattr


__all__: list[str] = []
__getattr__ = module_getattr(__name__, "schedulers")
