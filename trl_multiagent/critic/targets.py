"""One-step TD targets, advantages and the value loss of a learned critic over the rollout tree (CoMLRL 1.4.3's IAC and
MAAC, `docs/critics.md`).

How the tree maps (see `rollout.RolloutTree` and `credit.returns`): a *sample* of CoMLRL's actor-critic is one agent's
completion at one turn; here it is one agent's part of a joint action. In ``"aligned"`` mode (CoMLRL's only one) a
joint action holds completion j of every agent, so each agent's completions and the joint actions correspond one to
one, and everything below is indexed by joint-action id, with one row per agent where agents differ.

- A *value* is what the critic said at rollout time about a joint action's sample: V(h), from the history (prompt) at
  its node, the same for every joint action of the node; or Q(h, a), from the history and the answer (IAC: the
  agent's own answer; MAAC: every agent's). IAC has one critic per agent, so ``(agents, joint actions)`` values;
  MAAC has one centralized critic, so ``(joint actions,)`` values shared by the agents.
- The *next* value of a joint action is the value of the node it expanded into: the mean of that node's joint actions'
  values. With one completion per agent (K=1, CoMLRL's multi-turn setting) that is the one sampled next action's
  value, as CoMLRL takes it; with K >= 2 it is the mean over the K sampled next actions (for V they are all equal).
- A joint action with no child, at the last turn or at a node that terminated early, is not bootstrapped: its target
  is its reward, as in CoMLRL ("no bootstrap after the final or an early-terminated turn").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch

from ..credit.options import zscore_scale


def td_targets(
    rewards: torch.Tensor, values: torch.Tensor, children: Sequence[Sequence[int]], discount: float = 1.0
) -> torch.Tensor:
    """One-step TD(0) targets: ``reward + discount * mean(value of the child node's joint actions)``, or the reward
    alone where a joint action has no child.

    Args:
        rewards: ``(A,)`` the team's reward of each joint action, or ``(agents, A)`` each agent's own.
        values: ``(A,)`` one centralized critic's (MAAC) or ``(agents, A)`` each agent's critic's (IAC) rollout-time
            value of each joint action: V(h) of its node, or Q(h, a).
        children: for each joint action, the ids of the joint actions of the node it expanded into
            (`RolloutTree.children()`); a child always has a larger id than its parent.
        discount: weight of the next value, in [0, 1].

    Returns:
        ``rewards`` and ``values`` broadcast: ``(A,)``, or ``(agents, A)`` where either has a row per agent.

    Joint action 0 (reward 1.0) expanded into the node of joint actions 2 and 3, whose Q values are 2.0 and 4.0;
    joint action 1 ended there:

    >>> td_targets(torch.tensor([1.0, 0.5, 0.0, 1.0]), torch.tensor([9.0, 9.0, 2.0, 4.0]), [[2, 3], [], [], []], 0.5)
    tensor([2.5000, 0.5000, 0.0000, 1.0000])
    """
    rewards, values = torch.as_tensor(rewards, dtype=torch.float32), torch.as_tensor(values, dtype=torch.float32)
    count = len(children)
    if rewards.shape[-1] != count or values.shape[-1] != count or rewards.dim() > 2 or values.dim() > 2:
        raise ValueError(
            f"td_targets: rewards {tuple(rewards.shape)} and values {tuple(values.shape)} must be (A,) or "
            f"(agents, A) with A = {count} joint actions (the length of children)."
        )
    if not 0.0 <= discount <= 1.0:
        raise ValueError(f"td_targets: discount must be in [0, 1], got {discount}.")
    next_values = torch.zeros_like(values)
    for a, kids in enumerate(children):
        if any(c <= a for c in kids):
            raise ValueError(f"td_targets: joint action {a} has a child id <= its own: {list(kids)}.")
        if kids:
            next_values[..., a] = values[..., list(kids)].mean(dim=-1)
    return rewards + discount * next_values


def td_advantages(
    targets: torch.Tensor,
    values: torch.Tensor,
    groups: Sequence[int],
    normalize: bool = True,
    gather: Callable[[list], list] | None = None,
) -> torch.Tensor:
    """Advantages ``target - value``, each agent's standardised within each group of joint actions, as CoMLRL
    normalises them within each agent's samples of one turn: minus their mean, over their population std clamped at
    1e-6 (`credit.options.group_zscore`'s scale, the rule of CoMLRL's MAGRPO too). A group of one sample is left as it
    is.

    Args:
        targets, values: ``(A,)`` or ``(agents, A)`` (broadcast); a row is one agent's.
        groups: the group of each joint action, e.g. its turn.
        normalize: False leaves ``target - value`` as it is (CoMLRL's normalisation switched off).
        gather: with several processes, each with samples of its own (accelerate's `gather_object`): every process's
            ``[(advantages, groups)]`` joined in process order; a group's mean and std are then taken over all of
            them, as one process holding every sample would take them.

    >>> td_advantages(torch.tensor([2.0, 0.0, 5.0]), torch.tensor([1.0, 1.0, 1.0]), groups=[1, 1, 2])
    tensor([ 1., -1.,  4.])
    """
    advantages = (torch.as_tensor(targets, dtype=torch.float32) - torch.as_tensor(values, dtype=torch.float32)).clone()
    if advantages.shape[-1] != len(groups):
        raise ValueError(f"td_advantages: {advantages.shape[-1]} joint actions but {len(groups)} groups.")
    if not normalize:
        return advantages
    everyone = (gather or (lambda items: items))([(advantages, list(groups))])
    out = advantages.clone()
    for group in sorted(set(groups)):
        members = [a for a, g in enumerate(groups) if g == group]
        together = torch.cat(
            [part[..., [a for a, g in enumerate(part_groups) if g == group]] for part, part_groups in everyone], dim=-1
        )
        if together.shape[-1] < 2:
            continue
        mean, std = zscore_scale(together)
        out[..., members] = (advantages[..., members] - mean) / std
    return out


def value_loss(
    values: torch.Tensor,
    targets: torch.Tensor,
    value_loss_coef: float,
    old_values: torch.Tensor | None = None,
    value_clip_range: float | None = None,
    weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """``value_loss_coef`` times the mean squared error of the values against their targets (with `weights`, the
    errors' weighted sum instead: a chunk's share of a mean over more rows). With a
    `value_clip_range` (CoMLRL clips a value head that shares the actor's backbone, IAC's
    ``use_separate_critic=False``, and nothing else), each error is the larger of the plain one and that of the value
    kept within `value_clip_range` of its rollout-time value `old_values`.

    >>> value_loss(torch.tensor([1.0, 3.0]), torch.tensor([2.0, 2.0]), 0.5)
    tensor(0.5000)

    The value moved from 0.0 to 1.0 towards a target of 2.0: clipped at 0.2 it counts as 0.2, whose error is larger:

    >>> value_loss(torch.tensor([1.0]), torch.tensor([2.0]), 1.0, old_values=torch.tensor([0.0]), value_clip_range=0.2)
    tensor(3.2400)
    """
    error = (targets - values) ** 2
    if value_clip_range is not None:
        if old_values is None or not value_clip_range >= 0:
            raise ValueError(
                f"value_loss: value_clip_range={value_clip_range} needs old_values and a range >= 0 "
                f"(got old_values={'None' if old_values is None else 'a tensor'})."
            )
        kept = old_values + (values - old_values).clamp(-value_clip_range, value_clip_range)
        error = torch.maximum(error, (targets - kept) ** 2)
    return value_loss_coef * (error.mean() if weights is None else (weights.to(error) * error).sum())


class TD(NamedTuple):
    """What `tree_td` gives the update."""

    targets: torch.Tensor  # the value targets, which are also the advantages' targets
    advantages: torch.Tensor  # normalised within each agent's joint actions of one turn, when asked


def tree_td(
    tree,
    values: torch.Tensor,
    discount: float,
    normalize: bool = True,
    rewards=None,
    gather: Callable[[list], list] | None = None,
) -> TD:
    """`td_targets` and `td_advantages` of a grown rollout tree (`rollout.RolloutTree`), grouped by turn as CoMLRL
    groups its samples (over every process's samples with `gather`: `td_advantages`). `rewards` defaults to the
    team's reward of each joint action (`JointAction.learned_reward`).

    A joint action that branching did not continue would have no next value to bootstrap from: such a tree is
    refused. The tree comes in as data, as in `credit.assign`."""
    if tree.pruned():
        raise ValueError(
            "tree_td: the tree has joint actions that branching did not continue; a critic's TD targets need every "
            "joint action of a node that goes on continued (branching='all')."
        )
    if rewards is None:
        rewards = torch.tensor([a.learned_reward for a in tree.joint_actions])
    targets = td_targets(rewards, values, tree.children(), discount)
    turns = [tree.nodes[a.node].turn for a in tree.joint_actions]
    return TD(targets, td_advantages(targets, values, turns, normalize, gather))
