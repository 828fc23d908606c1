"""A learned critic for a team (floor 0): the one-step TD targets, advantages and value loss of CoMLRL's IAC and MAAC
over the rollout tree (`targets`, plain functions), a value head on a causal LM's hidden states (`value_head`), and the
critic models with their values and update, which the trainer's step calls when a critic is set (`learner`). What is
built and what is not: docs/critics.md."""

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
