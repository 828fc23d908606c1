"""One learning rate per agent (`MAGRPOConfig.agent_learning_rates`, after Dr. MAS,
arXiv 2602.08847), as optimizer parameter groups.

The Trainer builds one optimizer over the team with two groups (weight decay or not). With `agent_learning_rates`,
each agent's trainable parameters (`AgentTeam.agent_parameters`: its model, or its adapter on a shared base) get
groups of their own, split by weight decay as the Trainer splits them, each with `"lr": agent_learning_rates[i]`.
The optimizer class and its keywords stay the Trainer's (`optim`, `optim_args`, `adam_beta1`, ...). The scheduler
(a `LambdaLR`) multiplies every group's initial rate by the same factor, so the rates keep their ratios; the groups
and their rates are saved with the optimizer and restored on resume (said at WARNING when they differ from
`agent_learning_rates`, which then has no effect: `KeptRatesWarning`).

Under DeepSpeed, the Trainer's optimizer (this one) is used when the DeepSpeed config has no "optimizer" section.
Each rule on `agent_learning_rates` has one place: the rates themselves (finite, >= 0, one per agent) are
`check_rates`'s, applied by the config, and by the trainer where the config had no `num_agents`; an optimizer given to
the trainer (`optimizers=`, used as it is) or a DeepSpeed optimizer or scheduler that would drop them,
`arguments.learning_rates.check_agent_learning_rates`'s, when the trainer is built; an `optim` that builds its own
parameter groups, `create_optimizer`'s, once the model is there (GaLore and APOLLO need it to say what they build).
"""

from __future__ import annotations

import math

import torch
from transformers import TrainerCallback
from transformers.utils import logging


logger = logging.get_logger(__name__)


def check_rates(rates, num_agents: int | None, team: str) -> None:
    """`MAGRPOConfig.agent_learning_rates`: finite numbers >= 0, one per agent. `num_agents` is the team's size once it
    is known (`MAGRPOConfig.num_agents` when the config is built, the team's when the trainer is), said as `team`.

    >>> check_rates([1e-5], 2, "a team of 2 agents")
    Traceback (most recent call last):
    ...
    ValueError: MAGRPOConfig: agent_learning_rates has 1 rates for a team of 2 agents; give one per agent (got [1e-05]).
    """
    if rates is None:
        return
    if any(isinstance(r, bool) or not isinstance(r, (int, float)) or not math.isfinite(r) or r < 0 for r in rates):
        raise ValueError(
            f"MAGRPOConfig: agent_learning_rates must be finite numbers >= 0, one per agent; got {list(rates)}."
        )
    if num_agents is not None and len(rates) != num_agents:
        raise ValueError(
            f"MAGRPOConfig: agent_learning_rates has {len(rates)} rates for {team}; give one per agent (got "
            f"{list(rates)})."
        )


def agent_parameter_groups(team, model: torch.nn.Module, rates: list[float], decay_names, weight_decay: float):
    """Optimizer groups: for each agent, its trainable parameters with and without weight decay, at its rate.

    `model` is what the optimizer covers (the team); `decay_names` are its parameter names that take weight decay
    (`Trainer.get_decay_parameter_names`). A frozen agent (`trainable_agents`) has no trainable parameter, hence no
    group. A trainable parameter that belongs to no agent is refused: it would have no rate.
    """
    decay_names = set(decay_names)
    name_of = {id(p): n for n, p in model.named_parameters()}
    groups, seen = [], set()
    for i, rate in enumerate(rates):
        own = [p for p in team.agent_parameters(i) if p.requires_grad and id(p) not in seen]
        seen.update(id(p) for p in own)
        for decays in (True, False):
            params = [p for p in own if (name_of.get(id(p)) in decay_names) == decays]
            if params:
                groups.append({"params": params, "weight_decay": weight_decay if decays else 0.0, "lr": rate})
    unowned = [n for n, p in model.named_parameters() if p.requires_grad and id(p) not in seen]
    if unowned:
        raise ValueError(
            f"MAGRPOConfig.agent_learning_rates: {len(unowned)} trainable parameter(s) belong to no agent (first: "
            f"{unowned[0]!r}), so they would have no rate. Freeze them, or leave agent_learning_rates None."
        )
    return groups


class KeptRatesWarning(TrainerCallback):
    """On a resumed run, says once when the rates restored with the optimizer (each group's `initial_lr`, which the
    scheduler scales) differ from `agent_learning_rates`: the checkpoint's are the ones used, the field has no effect."""

    def __init__(self, configured: list[float], agent_learning_rates: list[float]):
        self.configured = configured  # per optimizer group, as `agent_parameter_groups` built them
        self.agent_learning_rates = agent_learning_rates

    def on_train_begin(self, args, state, control, optimizer=None, **kwargs):
        if state.global_step == 0 or optimizer is None:
            return
        restored = [group.get("initial_lr", group["lr"]) for group in optimizer.param_groups]
        if restored != self.configured:
            logger.warning(
                f"MAGRPOTrainer: resuming at step {state.global_step} with the learning rates saved in the checkpoint "
                f"(per optimizer group: {restored}); agent_learning_rates={self.agent_learning_rates} asks for "
                f"{self.configured} and is not applied, as a changed `learning_rate` is not on resume. Start a new run "
                "to train at other rates."
            )


def agent_rates_optimizer(
    team, model, rates: list[float], optimizer_cls, optimizer_kwargs: dict, decay_names: list[str], args
) -> tuple[torch.optim.Optimizer, KeptRatesWarning]:
    """The optimizer `MAGRPOTrainer.create_optimizer` builds with `agent_learning_rates`: the Trainer's
    `optimizer_cls` and `optimizer_kwargs` over each agent's own parameter groups (`agent_parameter_groups`) at
    `rates[i]`, and the `KeptRatesWarning` to add as a callback. An `optim` that builds its own groups is refused."""
    builds_own_groups = sorted({"params", "model", "optimizer_dict"} & set(optimizer_kwargs))
    if not (isinstance(optimizer_cls, type) and issubclass(optimizer_cls, torch.optim.Optimizer)):
        builds_own_groups.append("a factory that groups the model's parameters itself")
    if builds_own_groups:
        raise ValueError(
            f"MAGRPOConfig.agent_learning_rates needs an optimizer built from parameter groups, but "
            f"optim={args.optim!r} builds its own ({', '.join(builds_own_groups)}), so the per-agent rates "
            "would be ignored. Choose another `optim`, or leave agent_learning_rates None."
        )
    groups = agent_parameter_groups(team, model, rates, decay_names, args.weight_decay)
    return optimizer_cls(groups, **optimizer_kwargs), KeptRatesWarning([group["lr"] for group in groups], list(rates))
