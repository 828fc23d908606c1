"""CoMLRL's `comlrl.trainers.actor_critic`: `IACConfig`/`IACTrainer` and `MAACConfig`/`MAACTrainer`, as the face's
classes (docs/critics.md); its other names (`ActorCriticTrainerBase`, `RolloutSample`) raise `NotProvidedError`, naming
them (`not_provided`)."""

from ...not_provided import module_getattr
from .iac import IACConfig, IACTrainer
from .maac import MAACConfig, MAACTrainer


__all__ = ["IACConfig", "IACTrainer", "MAACConfig", "MAACTrainer"]
__getattr__ = module_getattr(__name__, "trainers.actor_critic")
