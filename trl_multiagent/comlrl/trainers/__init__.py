"""CoMLRL's `comlrl.trainers`: what it exports that the face provides (MAGRPO, MAREINFORCE, MARLOO, MAReMax, IAC,
MAAC); its other names (the preference trainers, the actor-critic base class) raise `NotProvidedError`, naming them (`not_provided`)."""

from ..not_provided import module_getattr
from .actor_critic import IACConfig, IACTrainer, MAACConfig, MAACTrainer
from .reinforce import (
    MAGRPOConfig,
    MAGRPOTrainer,
    MAREINFORCEConfig,
    MAREINFORCETrainer,
    MAReMaxConfig,
    MAReMaxTrainer,
    MARLOOConfig,
    MARLOOTrainer,
)


__all__ = [
    "MAGRPOConfig",
    "MAGRPOTrainer",
    "MAREINFORCEConfig",
    "MAREINFORCETrainer",
    "MAReMaxConfig",
    "MAReMaxTrainer",
    "MARLOOConfig",
    "MARLOOTrainer",
    "IACConfig",
    "IACTrainer",
    "MAACConfig",
    "MAACTrainer",
]
__getattr__ = module_getattr(__name__, "trainers")
