"""CoMLRL 1.4.3's face: `MAGRPOConfig` and `MAGRPOTrainer` with CoMLRL's names, defaults and calls, as subclasses of
the TRL face's (`trl_multiagent.MAGRPOConfig`, `MAGRPOTrainer`), so still a `trl.GRPOTrainer` on the same core.

A CoMLRL script runs with its import changed::

    from trl_multiagent.comlrl import MAGRPOConfig, MAGRPOTrainer

Nothing outside this package knows a CoMLRL name or convention (docs/from_comlrl.md).
"""

from .config import MAGRPOConfig
from .trainer import MAGRPOTrainer


__all__ = ["MAGRPOConfig", "MAGRPOTrainer"]
