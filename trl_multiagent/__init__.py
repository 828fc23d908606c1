"""MAGRPO for Hugging Face TRL: several cooperating LLM agents trained on a joint reward."""

from .config import MAGRPOConfig
from .team.agent_team import AgentTeam
from .trainer import MAGRPOTrainer


__all__ = ["AgentTeam", "MAGRPOConfig", "MAGRPOTrainer"]
__version__ = "0.1.0"
