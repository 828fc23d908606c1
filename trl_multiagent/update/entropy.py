"""GRPOConfig's entropy bonus for a team: `entropy_coef`, static or adaptive (`use_adaptive_entropy`), each agent with
its own coefficient.

TRL's objective, for each agent: ``L = L_policy - coef * H``, where ``H`` is the mean per-token entropy over the
tokens of the micro-batch that the policy loss acts on (all completion tokens, or the high-entropy ones with
`top_entropy_quantile < 1`), divided by the gradient-accumulation steps in training. GRPOTrainer adds it inside
`_compute_loss`, as a mean over the tokens of one call; the team's update runs each agent's micro-batch in chunks
(`update_chunk_size`) whose losses are weighted as the loss type normalises, which would weigh the bonus the same way.
So the trainer turns TRL's bonus off and adds this one, whose chunks weigh their entropy sum over the agent's tokens in
the whole micro-batch: the chunks add up to TRL's bonus on the micro-batch.

Adaptive control (Skywork-OR1), as TRL does it, per agent: after each optimizer step, the agent's mean entropy over the
step's tokens (every micro-batch, every process) raises its coefficient by `entropy_coef_delta` when at or below
`entropy_target`, and lowers it otherwise, within `[entropy_coef_min, entropy_coef_max]`; a step applies the
coefficient only while the last measured entropy is at or below the target (none before the first measurement).

>>> control = EntropyControl(num_agents=2, coef=0.1, adaptive=True, target=0.5, delta=0.05, low=0.0, high=1.0)
>>> control.applied(0)  # no measurement yet: no bonus
0.0
>>> control.record(0, torch.tensor([[0.2, 0.4]]), torch.ones(1, 2))  # agent 0: mean 0.3, at or below the target
>>> control.record(1, torch.tensor([[0.9, 0.7]]), torch.ones(1, 2))  # agent 1: mean 0.8, above it
>>> control.end_step(reduce=lambda stats: stats)  # one process
>>> [round(c, 2) for c in control.coefs], round(control.applied(0), 2), control.applied(1)
([0.15, 0.05], 0.15, 0.0)
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable

import torch
from transformers import TrainerCallback

from .batching import loss_mask
from .chunking import BATCH_NORMALISED_LOSSES


ENTROPY_STATE_NAME = "team_entropy_state.json"  # in each checkpoint: `EntropyControl.state_dict()`


class EntropyControl:
    """Each agent's entropy coefficient, and the entropy of the current optimizer step for the adaptive control.

    The state that a checkpoint keeps is `state_dict()`: the coefficients and the last measured entropies.
    """

    def __init__(
        self, num_agents: int, coef: float, adaptive: bool, target: float, delta: float, low: float, high: float
    ):
        self.coefs = [float(coef)] * num_agents
        self.adaptive, self.target, self.delta, self.low, self.high = adaptive, target, delta, low, high
        self.last_entropies = [math.inf] * num_agents  # inf: no bonus until the first measurement, as TRL
        self._window = torch.zeros(num_agents, 2, dtype=torch.float64)  # per agent: entropy sum, token count

    @classmethod
    def from_args(cls, args, num_agents: int) -> EntropyControl | None:
        """The control `args` ask for, or None when the bonus is off (`entropy_coef=0` and not adaptive)."""
        if args.entropy_coef == 0.0 and not args.use_adaptive_entropy:
            return None
        return cls(
            num_agents,
            args.entropy_coef,
            args.use_adaptive_entropy,
            args.entropy_target,
            args.entropy_coef_delta,
            args.entropy_coef_min,
            args.entropy_coef_max,
        )

    def applied(self, agent: int) -> float:
        """The coefficient this step applies to `agent`: its own, or 0 while its entropy is above the target."""
        if self.adaptive and self.last_entropies[agent] > self.target:
            return 0.0
        return self.coefs[agent]

    def record(self, agent: int, entropies: torch.Tensor, mask: torch.Tensor) -> None:
        """Add a chunk's entropy sum and token count to the step's, for the adaptive control."""
        if self.adaptive:
            stats = torch.stack([(entropies.detach() * mask).sum(), mask.sum()]).to(self._window)
            self._window[agent] += stats.cpu()

    def end_step(self, reduce: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """At an optimizer step: measure each agent's entropy over the step (`reduce` sums the `(agents, 2)` stats over
        the processes) and move its coefficient; then start a new step."""
        if not self.adaptive:
            return
        window = reduce(self._window)
        for agent, (total, count) in enumerate(window.tolist()):
            if count == 0:
                continue  # a frozen agent, or no token: nothing measured
            entropy = total / count
            step = self.delta if entropy <= self.target else -self.delta
            self.coefs[agent] = min(max(self.coefs[agent] + step, self.low), self.high)
            self.last_entropies[agent] = entropy
        self._window.zero_()

    def state_dict(self) -> dict:
        return {"entropy_coefs": list(self.coefs), "last_entropies": list(self.last_entropies)}

    def load_state_dict(self, state: dict) -> None:
        if len(state["entropy_coefs"]) != len(self.coefs):
            raise ValueError(
                f"EntropyControl.load_state_dict: the checkpoint holds {len(state['entropy_coefs'])} agents' entropy "
                f"coefficients, this team has {len(self.coefs)} agents."
            )
        self.coefs, self.last_entropies = list(state["entropy_coefs"]), list(state["last_entropies"])


def policy_loss_scale(loss_type: str, accumulation: float) -> float:
    """The factor that turns `_compute_loss`'s value into TRL's `policy_loss` metric: TRL logs the policy term before
    its division by the accumulation steps, which the batch-normalised loss types fold into their normaliser."""
    return 1.0 if loss_type in BATCH_NORMALISED_LOSSES else accumulation


class EntropyStep(TrainerCallback):
    """At each optimizer step: the adaptive control's measurement (`EntropyControl.end_step`, one all-reduce), and
    TRL's `entropy_coef` metric (the coefficient the next step starts from; the agents' mean, and each agent's)."""

    def __init__(self, control: EntropyControl, accelerator, log: Callable[[str, dict], None]):
        self.control, self.accelerator, self.log = control, accelerator, log

    def on_optimizer_step(self, args, state, control, **kwargs):
        device = self.accelerator.device
        self.control.end_step(lambda stats: self.accelerator.reduce(stats.to(device), reduction="sum").cpu())
        coefs = self.control.coefs
        metrics = {"entropy_coef": sum(coefs) / len(coefs)}
        if len(coefs) > 1:
            metrics.update({f"agent_{i}/entropy_coef": coef for i, coef in enumerate(coefs)})
        self.log("train", metrics)


class TeamEntropyBonus:
    """The entropy bonus of GRPOTrainer, per agent (mixed into `MAGRPOTrainer`, before `GRPOTrainer`), and the state
    it owns: each agent's coefficient (`entropy_control`), saved with each checkpoint and read back on resume.

    TRL's own bonus is off (`_entropy_bonus_enabled`); `entropy_bonus` subtracts this one from the loss of one call
    of TRL's `_compute_loss`, on the entropies of that call's forward (`loss_call.LossCall`). A chunk's mean entropy is
    scaled by its share of the agent's loss tokens over its loss weight (`chunking.update_chunks` sets both), so that
    the weighted chunks add up to the mean over the micro-batch. TRL's `policy_loss` metric (the loss before the
    bonus, the team's sum) is logged once per micro-batch by `log_policy_loss`, as GRPOTrainer logs it when the bonus
    is on.

    Overrides `_save_optimizer_and_scheduler` and `_load_optimizer_and_scheduler`: the coefficients are written into
    each checkpoint beside the optimizer (`ENTROPY_STATE_NAME`) and read back with it, as GRPOTrainer keeps its one
    coefficient (it writes it from `_save_checkpoint`; the optimizer's own pair keeps saving and loading symmetric).
    """

    @property
    def entropy_coef(self) -> float:
        """GRPOTrainer's attribute: the entropy coefficient, the agents' mean (each one's: `entropy_control.coefs`)."""
        control = getattr(self, "entropy_control", None)
        return sum(control.coefs) / len(control.coefs) if control is not None else self._entropy_coef

    @entropy_coef.setter
    def entropy_coef(self, value: float) -> None:  # GRPOTrainer's __init__ sets it; so may a user, for every agent
        control = getattr(self, "entropy_control", None)
        if control is not None:
            control.coefs = [float(value)] * len(control.coefs)
        self._entropy_coef = value

    def _set_up_entropy_bonus(self, args) -> None:
        self.entropy_control = EntropyControl.from_args(args, self.num_agents)
        # GRPOTrainer's bonus, adaptive control and `entropy_ctrl_state.json` are off: this class holds them per agent
        self._entropy_bonus_enabled, self.use_adaptive_entropy = False, False
        if self.entropy_control is not None:
            self.add_callback(EntropyStep(self.entropy_control, self.accelerator, self._log_metrics))

    def entropy_bonus(
        self, agent: int, loss: torch.Tensor, inputs: dict, entropies: torch.Tensor | None, policy_losses: list
    ) -> torch.Tensor:
        """`loss`, TRL's `_compute_loss` of `agent`'s `inputs`, less the agent's bonus on the `entropies` of that
        call's forward; its policy term goes into `policy_losses` (the micro-batch's, for `log_policy_loss`)."""
        if self.entropy_control is None:
            return loss
        training, weight = self.model.training, inputs.get("loss_weight", 1.0)
        accumulation = self.current_gradient_accumulation_steps if training else 1.0
        policy_losses.append(weight * loss.detach() * policy_loss_scale(self.loss_type, accumulation))
        mask = loss_mask(inputs)
        if self.top_entropy_quantile < 1.0:  # the tokens the policy loss acts on, as TRL's bonus
            mask = mask * self.get_high_entropy_mask(entropies, mask, 1 - self.top_entropy_quantile)
        if training:
            self.entropy_control.record(agent, entropies, mask)
        mean = (entropies * mask).sum() / mask.sum().clamp(min=1.0)
        scale = inputs.get("token_share", 1.0) / weight if weight else 0.0
        return loss - self.entropy_control.applied(agent) * mean * scale / accumulation

    def log_policy_loss(self, policy_losses: list) -> None:
        """After a micro-batch's loss: TRL's `policy_loss` metric, the mean over the processes of the team's (the sum
        of `policy_losses`, which `entropy_bonus` filled)."""
        if self.entropy_control is not None:
            total = sum(policy_losses, 0.0)
            value = torch.as_tensor(total, dtype=torch.float32, device=self.accelerator.device)
            mode = "train" if self.model.training else "eval"
            self._metrics[mode]["policy_loss"].append(self.accelerator.gather(value).nanmean().item())

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        """The Trainer's (the optimizer and scheduler, into the checkpoint being written), then, with the adaptive
        control, each agent's coefficient beside them: what `_load_optimizer_and_scheduler` reads back on resume."""
        super()._save_optimizer_and_scheduler(output_dir)
        control = self.entropy_control
        if control is not None and control.adaptive and self.args.should_save:
            with open(os.path.join(output_dir, ENTROPY_STATE_NAME), "w") as file:
                json.dump(control.state_dict(), file)

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        """The Trainer's, then, with the adaptive control, each agent's coefficient where the checkpoint has them."""
        super()._load_optimizer_and_scheduler(checkpoint)
        control = self.entropy_control
        path = os.path.join(checkpoint, ENTROPY_STATE_NAME) if checkpoint is not None else None
        if control is not None and control.adaptive and path is not None and os.path.isfile(path):
            with open(path) as file:
                control.load_state_dict(json.load(file))
