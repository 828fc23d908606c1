"""CoMLRL's `comlrl.utils.checkpoint`: `read_checkpoint_metadata`, on this face's checkpoints (`comlrl.checkpoints`).
CoMLRL's checkpoint machinery (`TrainingCheckpointMixin`, `capture_trainer_state`, ...) writes its own
`training_state.pt`; here checkpoints are the Trainer's, so those names raise `NotProvidedError`, naming them."""

from ..checkpoints import read_checkpoint_metadata
from ..not_provided import module_getattr


__all__ = ["read_checkpoint_metadata"]
__getattr__ = module_getattr(__name__, "utils.checkpoint")
