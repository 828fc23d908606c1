"""CoMLRL 1.4.3's face: `MAGRPOConfig` and `MAGRPOTrainer` with CoMLRL's names, defaults and calls, as subclasses of
the TRL face's (`trl_multiagent.MAGRPOConfig`, `MAGRPOTrainer`), so still a `trl.GRPOTrainer` on the same core; and
CoMLRL's REINFORCE family on them (`MAREINFORCE*`, `MARLOO*`, `MAReMax*`, `CentralizedMAGRPO*`), and its
actor-critic trainers (`IAC*`, `MAAC*`: a learned critic's advantages, `trl_multiagent.critic`).

A CoMLRL script runs with `comlrl` replaced by `trl_multiagent.comlrl` in its imports, flat or by CoMLRL's module
paths::

    from trl_multiagent.comlrl import MAGRPOConfig, MAGRPOTrainer
    from trl_multiagent.comlrl.trainers.reinforce import MARLOOConfig, MARLOOTrainer
    from trl_multiagent.comlrl.utils.reward_processor import RewardProcessors
    from trl_multiagent.comlrl.utils import read_checkpoint_metadata

CoMLRL's other public names (its preference trainers, the actor-critic base class, its helpers) raise an `ImportError` that names
them (`not_provided`). Outside this package no module uses CoMLRL's own names or imports from it
(`tests/test_layers.py`): the TRL face tells a user who gives it a CoMLRL name what TRL calls it from this face's table
(`names`), which the package's `__init__`, above both faces, registers with `keywords`. Elsewhere CoMLRL is mentioned to
point to this face, as the source of a credit option, in a comparison, or in the hint of one message
(`arguments.datasets`: one prompt per step, as CoMLRL trains) (docs/from_comlrl.md).
"""

from .config import MAGRPOConfig
from .not_provided import module_getattr
from .trainer import MAGRPOTrainer
from .trainers.actor_critic import IACConfig, IACTrainer, MAACConfig, MAACTrainer
from .trainers.preference import (
    CentralizedComparatorAdapter,
    CentralizedComparatorParseError,
    TaggedCentralizedComparatorAdapter,
)
from .trainers.reinforce import (
    CentralizedMAGRPOConfig,
    CentralizedMAGRPOTrainer,
    MAREINFORCEConfig,
    MAREINFORCETrainer,
    MAReMaxConfig,
    MAReMaxTrainer,
    MARLOOConfig,
    MARLOOTrainer,
)
from .utils import RewardProcessors, read_checkpoint_metadata


__all__ = [
    "MAGRPOConfig",
    "MAGRPOTrainer",
    "MAREINFORCEConfig",
    "MAREINFORCETrainer",
    "MARLOOConfig",
    "MARLOOTrainer",
    "MAReMaxConfig",
    "MAReMaxTrainer",
    "CentralizedMAGRPOConfig",
    "CentralizedMAGRPOTrainer",
    "IACConfig",
    "IACTrainer",
    "MAACConfig",
    "MAACTrainer",
    "CentralizedComparatorAdapter",
    "CentralizedComparatorParseError",
    "TaggedCentralizedComparatorAdapter",
    "RewardProcessors",
    "read_checkpoint_metadata",
]
__getattr__ = module_getattr(__name__, None)
