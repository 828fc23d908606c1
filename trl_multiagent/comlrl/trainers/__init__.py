"""CoMLRL's `comlrl.trainers`: what it exports that the face provides (MAGRPO, MAREINFORCE, MARLOO, MAReMax); its
other names (the actor-critic and preference trainers) raise `NotProvidedError`, naming them (`not_provided`)."""

from ..not_provided import module_getattr
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
]
__getattr__ = module_getattr(__name__, "trainers")
