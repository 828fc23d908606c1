"""CoMLRL 1.4.3's `MARLOOConfig` and `MARLOOTrainer`: MAGRPO with a leave-one-out baseline."""

from dataclasses import dataclass, field

from .magrpo import MAGRPOConfig, MAGRPOTrainer


@dataclass
class MARLOOConfig(MAGRPOConfig):
    """CoMLRL 1.4.3's `MARLOOConfig`: the face's `MAGRPOConfig` with `advantage_mode="rloo"` by default (each return
    less the mean of its group's other returns); every other field, default and check is MAGRPOConfig's. As in CoMLRL,
    `advantage_mode` may still be given; with `advantage_normalization=True` (the default) the advantages are
    normalised, so the variant trains as MAGRPO does (docs/from_comlrl.md, "Trainer families")."""

    advantage_mode: str = field(default="rloo", metadata={"help": "rloo: leave-one-out baseline (CoMLRL's MARLOO)."})


class MARLOOTrainer(MAGRPOTrainer):
    """CoMLRL 1.4.3's `MARLOOTrainer`: the face's `MAGRPOTrainer`, building `MARLOOConfig()` when no `args` is given.
    An `args` given is used as it is (a `MAGRPOConfig` keeps its `advantage_mode`), as in CoMLRL."""

    default_config_cls = MARLOOConfig
    algorithm_name = _name = "MARLOO"
