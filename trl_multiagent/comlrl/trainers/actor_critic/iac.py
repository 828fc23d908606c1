"""CoMLRL's `comlrl.trainers.actor_critic.iac`: `IACConfig` and `IACTrainer` (independent actor-critic)."""

from .config import IACConfig
from .trainer import IACTrainer


__all__ = ["IACConfig", "IACTrainer"]
