"""The team: N policies in one module (`agent_team.AgentTeam`), built from ids, folders or models with their
tokenizers and adapters (`assembly`), and what a model's config says of its size (`model_config`)."""

from .agent_team import AgentTeam


__all__ = ["AgentTeam"]
