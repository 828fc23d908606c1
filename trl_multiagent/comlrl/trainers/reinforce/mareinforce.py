"""CoMLRL 1.4.3's `MAREINFORCEConfig` and `MAREINFORCETrainer`: MAGRPO whose advantage is the raw return."""

from dataclasses import dataclass, field

from .magrpo import MAGRPOConfig, MAGRPOTrainer


@dataclass
class MAREINFORCEConfig(MAGRPOConfig):
    """CoMLRL 1.4.3's `MAREINFORCEConfig`: the face's `MAGRPOConfig` with `advantage_mode="raw"` by default
    (REINFORCE without a baseline); every other field, default and check is MAGRPOConfig's. As in CoMLRL,
    `advantage_mode` may still be given; with `advantage_normalization=True` (the default) the advantages are
    normalised, so the variant trains as MAGRPO does (docs/from_comlrl.md, "Trainer families")."""

    advantage_mode: str = field(default="raw", metadata={"help": "raw: the return itself (CoMLRL's MAREINFORCE)."})


class MAREINFORCETrainer(MAGRPOTrainer):
    """CoMLRL 1.4.3's `MAREINFORCETrainer`: the face's `MAGRPOTrainer`, building `MAREINFORCEConfig()` when no `args`
    is given. An `args` given is used as it is (a `MAGRPOConfig` keeps its `advantage_mode`), as in CoMLRL."""

    default_config_cls = MAREINFORCEConfig
    algorithm_name = _name = "MAREINFORCE"
