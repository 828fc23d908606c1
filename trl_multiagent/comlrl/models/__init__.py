"""CoMLRL's `comlrl.models` (the actor-critic models): not provided; each name raises `NotProvidedError`."""

from ..not_provided import module_getattr


__all__: list[str] = []
__getattr__ = module_getattr(__name__, "models")
