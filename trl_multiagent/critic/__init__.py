"""A learned critic for a team (floor 0, plain functions and one module): the one-step TD targets, advantages and
value loss of CoMLRL's IAC and MAAC over the rollout tree (`targets`), and a value head on a causal LM's hidden states
(`value_head`). What is built and what is planned: docs/critics.md."""

from .targets import TD, td_advantages, td_targets, tree_td, value_loss
from .value_head import ValueHead, last_hidden, last_token_positions


__all__ = [
    "TD",
    "ValueHead",
    "last_hidden",
    "last_token_positions",
    "td_advantages",
    "td_targets",
    "tree_td",
    "value_loss",
]
