"""CoMLRL's `comlrl.trainers.actor_critic.maac`: `MAACConfig` and `MAACTrainer` (multi-agent actor-critic)."""

from .config import MAACConfig
from .trainer import MAACTrainer


__all__ = ["MAACConfig", "MAACTrainer"]
