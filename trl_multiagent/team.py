"""`AgentTeam`: the N policies as one module, so that one optimizer and one accelerate/DeepSpeed engine hold them all.

The Trainer (and DDP/DeepSpeed) see a single model. Every forward goes through the team, which routes it to the agent
selected with `acting(i)`: DDP and ZeRO hooks stay on the path, and each agent keeps its own architecture, vocabulary
and generation config.
"""

from __future__ import annotations

from contextlib import contextmanager

from torch import nn


class AgentTeam(nn.Module):
    def __init__(self, agents: list[nn.Module]):
        super().__init__()
        if not agents:
            raise ValueError("AgentTeam needs at least one agent.")
        self.agents = nn.ModuleList(agents)
        self.active = 0

    def __len__(self) -> int:
        return len(self.agents)

    @contextmanager
    def acting(self, index: int):
        """Route forwards to agent `index` inside the block."""
        previous, self.active = self.active, index
        try:
            yield self.agents[index]
        finally:
            self.active = previous

    def forward(self, *args, run=None, **kwargs):
        """The active agent's forward; or, with `run=fn`, `fn(self)`.

        `run` lets one call of the wrapped team (DDP, DeepSpeed) hold the forwards of every agent, so that the wrapper
        sees exactly one forward per backward, as it requires.
        """
        if run is not None:
            return run(self)
        return self.agents[self.active](*args, **kwargs)

    # What Trainer and GRPOTrainer read from "the model". `config` and `generation_config` are the first agent's: they
    # only serve code that expects one (model card, aux-loss checks); per-agent settings are read from each agent.
    @property
    def config(self):
        return self.agents[0].config

    @property
    def generation_config(self):
        return self.agents[0].generation_config

    # Activation checkpointing is switched on and off for every agent together (transformers' v5 and legacy names).
    @property
    def is_gradient_checkpointing(self) -> bool:
        return any(getattr(a, "is_gradient_checkpointing", False) for a in self.agents)

    is_activation_checkpointing = is_gradient_checkpointing

    def activation_checkpointing_enable(self, **kwargs):
        for agent in self.agents:
            agent.activation_checkpointing_enable(**kwargs)

    def activation_checkpointing_disable(self):
        for agent in self.agents:
            agent.activation_checkpointing_disable()

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None, **kwargs):
        for agent in self.agents:
            agent.gradient_checkpointing_enable(gradient_checkpointing_kwargs=gradient_checkpointing_kwargs, **kwargs)

    def gradient_checkpointing_disable(self):
        for agent in self.agents:
            agent.gradient_checkpointing_disable()

    def add_model_tags(self, tags):
        for agent in self.agents:
            if hasattr(agent, "add_model_tags"):
                agent.add_model_tags(tags)
