"""CoMLRL's `comlrl.trainers.reinforce`: MAGRPO and its REINFORCE family (MAREINFORCE, MARLOO, MAReMax, centralized
MAGRPO), as the face's classes."""

from ...not_provided import module_getattr
from .centralized_magrpo import CentralizedMAGRPOConfig, CentralizedMAGRPOTrainer
from .magrpo import MAGRPOConfig, MAGRPOTrainer
from .mareinforce import MAREINFORCEConfig, MAREINFORCETrainer
from .maremax import MAReMaxConfig, MAReMaxTrainer
from .marloo import MARLOOConfig, MARLOOTrainer


__all__ = [
    "MAGRPOConfig",
    "MAGRPOTrainer",
    "CentralizedMAGRPOConfig",
    "CentralizedMAGRPOTrainer",
    "MAREINFORCEConfig",
    "MAREINFORCETrainer",
    "MAReMaxConfig",
    "MAReMaxTrainer",
    "MARLOOConfig",
    "MARLOOTrainer",
]
__getattr__ = module_getattr(__name__, "trainers.reinforce")
