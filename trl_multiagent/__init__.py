"""MAGRPO for Hugging Face TRL: several cooperating LLM agents trained on a joint reward."""

import importlib
from typing import TYPE_CHECKING

from .keywords import register_face_names


if TYPE_CHECKING:  # for type checkers and the API docs (griffe reads these); at run time `__getattr__` imports them
    from .config import MAGRPOConfig
    from .evaluation.saved_team import load_team
    from .rewards.wrappers import joint, per_agent, per_joint_action
    from .team.agent_team import AgentTeam
    from .trainer import MAGRPOTrainer


__all__ = ["AgentTeam", "MAGRPOConfig", "MAGRPOTrainer", "joint", "load_team", "per_agent", "per_joint_action"]
__version__ = "0.1.0"

# Each public name's module, imported on first use (PEP 562): `python -m trl_multiagent.view` and the evaluation
# command's argument checks import this package, and must not wait for torch, TRL and transformers to load.
_MODULES = {
    "AgentTeam": ".team.agent_team",
    "MAGRPOConfig": ".config",
    "MAGRPOTrainer": ".trainer",
    "joint": ".rewards.wrappers",
    "load_team": ".evaluation.saved_team",
    "per_agent": ".rewards.wrappers",
    "per_joint_action": ".rewards.wrappers",
}

# The CoMLRL face's names, which the TRL face refuses with what each is in TRL's terms (`keywords`). Registered here,
# above both faces, so that neither the TRL face nor `keywords` imports the CoMLRL face: its table loads only to word
# such a refusal.
register_face_names(lambda: importlib.import_module(".comlrl.names", __name__).NAMES)


def __getattr__(name: str):
    if name not in _MODULES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_MODULES[name], __name__), name)
    globals()[name] = value  # later lookups find it without calling this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
