"""The values TRL's `_compute_loss` computes and does not return, handed over inside that one call.

GRPOTrainer's `_compute_loss(model, inputs)` runs the policy's forward once, first, through
`_get_per_token_logps_and_entropies`, and returns only the loss. Two parts of the team's update need that forward:

- the vLLM importance-sampling ratio of on-policy rows, which must be in the rows before TRL reads it, so it is set
  the moment the log-probs exist (`importance.RatioFromLoss.setter`);
- each agent's entropy bonus, from the forward's entropies, once the call is over (`entropy.TeamEntropyBonus`).

A `LossCall` is open for exactly one call of `_compute_loss` (`MAGRPOTrainer._team_loss` opens and closes it); the
trainer's log-prob function hands it its result only while one is open, so the log-prob passes outside the loss (old
and reference log-probs) hand nothing over. tests/test_private_api_contract.py keeps TRL's order: one forward, before
the ratio is read.

>>> call = LossCall(on_logps=lambda logps: print("ratio from", logps))
>>> call.observe("logps", "entropies")
ratio from logps
>>> call.observe("later logps", None)  # not the policy's forward of this call: kept out
>>> call.logps, call.entropies
('logps', 'entropies')
"""

from __future__ import annotations

from collections.abc import Callable

import torch


class LossCall:
    """The policy's forward inside one call of TRL's `_compute_loss`: its per-token log-probs and entropies.

    Args:
        on_logps: called with the log-probs as soon as the forward has computed them (inside the call), or None.
    """

    def __init__(self, on_logps: Callable[[torch.Tensor], None] | None = None):
        self.on_logps = on_logps
        self.logps: torch.Tensor | None = None
        self.entropies: torch.Tensor | None = None

    def observe(self, logps: torch.Tensor, entropies: torch.Tensor | None) -> None:
        """The log-prob function's result, while the call is open: the first one is the policy's forward."""
        if self.logps is not None:
            return
        self.logps, self.entropies = logps, entropies
        if self.on_logps is not None:
            self.on_logps(logps)
