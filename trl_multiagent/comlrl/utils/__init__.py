"""CoMLRL's `comlrl.utils`: `RewardProcessors` (and, from the comlrl-examples work of issue 57,
`read_checkpoint_metadata`, in `utils.checkpoint`); CoMLRL's other helpers are its trainers' internals and raise
`NotProvidedError`, naming them (`not_provided`)."""

from ..not_provided import module_getattr
from .reward_processor import RewardProcessors


__all__ = ["RewardProcessors"]
__getattr__ = module_getattr(__name__, "utils")
