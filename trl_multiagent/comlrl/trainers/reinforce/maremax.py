"""CoMLRL 1.4.3's `MAReMaxConfig` and `MAReMaxTrainer`: MAGRPO with the group's best return as baseline."""

from dataclasses import dataclass, field

from .magrpo import MAGRPOConfig, MAGRPOTrainer


@dataclass
class MAReMaxConfig(MAGRPOConfig):
    """CoMLRL 1.4.3's `MAReMaxConfig`: the face's `MAGRPOConfig` with `advantage_mode="max"` by default (each return
    less its group's largest); every other field, default and check is MAGRPOConfig's. As in CoMLRL,
    `advantage_mode` may still be given; with `advantage_normalization=True` (the default) the advantages are
    normalised, so the variant trains as MAGRPO does (docs/from_comlrl.md, "Trainer families")."""

    advantage_mode: str = field(
        default="max", metadata={"help": "max: the group's best return as baseline (MAReMax)."}
    )


class MAReMaxTrainer(MAGRPOTrainer):
    """CoMLRL 1.4.3's `MAReMaxTrainer`: the face's `MAGRPOTrainer`, building `MAReMaxConfig()` when no `args` is
    given. An `args` given is used as it is (a `MAGRPOConfig` keeps its `advantage_mode`), as in CoMLRL."""

    default_config_cls = MAReMaxConfig
    algorithm_name = _name = "MAReMax"
