"""CoMLRL's `comlrl.utils`: `RewardProcessors` and `read_checkpoint_metadata`; CoMLRL's other helpers are its
trainers' internals and raise `NotProvidedError`, naming them (`not_provided`)."""

from ..not_provided import module_getattr
from .checkpoint import read_checkpoint_metadata
from .reward_processor import RewardProcessors


__all__ = ["RewardProcessors", "read_checkpoint_metadata"]
__getattr__ = module_getattr(__name__, "utils")
