"""MAGRPO for Hugging Face TRL: several cooperating LLM agents trained on a joint reward."""

from .config import MAGRPOConfig
from .rewards.wrappers import joint, per_agent, per_joint_action
from .team.agent_team import AgentTeam
from .trainer import MAGRPOTrainer


__all__ = ["AgentTeam", "MAGRPOConfig", "MAGRPOTrainer", "joint", "per_agent", "per_joint_action"]
__version__ = "0.1.0"
