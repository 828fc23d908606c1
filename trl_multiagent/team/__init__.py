"""The team: N policies in one module (`agent_team.AgentTeam`), built from ids, folders or models with their
tokenizers and adapters (`assembly`), TRL's `ModelConfig` flags for a team (`model_config`), the optimizer's groups
per agent (`optimizer`) and each agent's reference kept in step (`reference_sync`)."""

from .agent_team import AgentTeam


__all__ = ["AgentTeam"]
