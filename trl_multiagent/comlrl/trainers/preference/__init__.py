"""CoMLRL's `comlrl.trainers.preference`: the centralized adapter's names, which `CentralizedMAGRPOTrainer` takes;
the preference trainers themselves (MADPO, MARLHF and their iterative variants) raise `NotProvidedError`."""

from ...not_provided import module_getattr
from .centralized import (
    CentralizedComparatorAdapter,
    CentralizedComparatorParseError,
    TaggedCentralizedComparatorAdapter,
)


__all__ = ["CentralizedComparatorAdapter", "CentralizedComparatorParseError", "TaggedCentralizedComparatorAdapter"]
__getattr__ = module_getattr(__name__, "trainers.preference")
