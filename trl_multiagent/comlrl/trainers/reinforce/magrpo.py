"""CoMLRL's `comlrl.trainers.reinforce.magrpo`: the face's `MAGRPOConfig` and `MAGRPOTrainer`."""

from ...config import MAGRPOConfig
from ...trainer import MAGRPOTrainer


__all__ = ["MAGRPOConfig", "MAGRPOTrainer"]
