"""Credit assignment for MAGRPO: returns over the rollout tree and per-agent group advantages.

Everything here is a plain function over lists and tensors, so it can be checked by hand without a model.

Vocabulary (see `rollout.RolloutTree`):

- a *node* is one state of the team: one prompt per agent. Every agent writes K completions at a node.
- a *joint action* is one choice of completion per agent at a node: in ``"aligned"`` mode the j-th completion of every
  agent (K joint actions); in ``"cross"`` mode every combination (K**N joint actions).
- a joint action that is expanded leads to one child node at the next turn.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch


JOINT_MODES = ("aligned", "cross")
ADVANTAGE_BASELINES = ("mean", "rloo", "max", "none")
SCALE_REWARDS = ("group", "batch", "none")


def joint_choices(num_agents: int, num_generations: int, joint_mode: str) -> list[tuple[int, ...]]:
    """The joint actions of one node, as one completion index per agent.

    >>> joint_choices(2, 3, "aligned")
    [(0, 0), (1, 1), (2, 2)]
    >>> joint_choices(2, 2, "cross")
    [(0, 0), (0, 1), (1, 0), (1, 1)]
    """
    if joint_mode == "aligned":
        return [(k,) * num_agents for k in range(num_generations)]
    if joint_mode == "cross":
        return list(itertools.product(range(num_generations), repeat=num_agents))
    raise ValueError(f"joint_mode must be one of {JOINT_MODES}, got {joint_mode!r}.")


def joint_returns(rewards: Sequence[float], children: Sequence[Sequence[int]], discount: float = 1.0) -> list[float]:
    """Return of every joint action: ``reward + discount * mean(return of the child node's joint actions)``.

    Args:
        rewards: the joint reward of each joint action, indexed by joint-action id.
        children: for each joint action, the ids of the joint actions of the node it expanded into (empty when the
            branch ended there). A child always has a larger id than its parent, as rollouts create them later.
        discount: weight of the future, 1.0 by default.

    >>> joint_returns([1.0, 0.0, 0.5, 1.5], [[2, 3], [], [], []], discount=0.5)
    [1.5, 0.0, 0.5, 1.5]
    """
    if len(rewards) != len(children):
        raise ValueError(f"joint_returns: {len(rewards)} rewards but {len(children)} children lists.")
    returns = [0.0] * len(rewards)
    for a in reversed(range(len(rewards))):
        kids = children[a]
        if any(c <= a for c in kids):
            raise ValueError(f"joint_returns: joint action {a} has a child id <= its own: {list(kids)}.")
        future = sum(returns[c] for c in kids) / len(kids) if kids else 0.0
        returns[a] = float(rewards[a]) + discount * future
    return returns


def completion_returns(
    choices: Sequence[tuple[int, ...]], returns: Sequence[float], num_agents: int, num_generations: int
) -> torch.Tensor:
    """Return credited to each agent's completion at one node: the mean return of the joint actions it is part of.

    In aligned mode a completion is in exactly one joint action, so it gets that joint action's return. In cross mode
    it is in K**(N-1) of them.

    Returns:
        A ``(num_agents, num_generations)`` float tensor.

    >>> completion_returns([(0, 0), (0, 1), (1, 0), (1, 1)], [1.0, 2.0, 3.0, 4.0], 2, 2)
    tensor([[1.5000, 3.5000],
            [2.0000, 3.0000]])
    """
    total = torch.zeros(num_agents, num_generations, dtype=torch.float64)
    count = torch.zeros(num_agents, num_generations, dtype=torch.float64)
    for choice, value in zip(choices, returns, strict=True):
        for agent, k in enumerate(choice):
            total[agent, k] += value
            count[agent, k] += 1
    if (count == 0).any():
        raise ValueError("completion_returns: some completion belongs to no joint action.")
    return (total / count).float()


def _std(x: torch.Tensor, dim=None, keepdim=False) -> torch.Tensor:
    # Bessel-corrected, like TRL's `nanstd`, so one agent and one turn reproduce GRPOTrainer's advantages exactly.
    return x.std(dim=dim, keepdim=keepdim) if dim is not None else x.std()


def group_advantages(returns: torch.Tensor, scale_rewards: str = "group", baseline: str = "mean") -> torch.Tensor:
    """Advantages for groups of K completions: ``(r - baseline(group)) / (std + 1e-4)``.

    Args:
        returns: ``(num_groups, K)``; one group is one agent's K completions at one node.
        scale_rewards: TRL's modes. ``"group"`` divides by the group's std, ``"batch"`` by the std of every return in
            ``returns``, ``"none"`` does not divide.
        baseline: what is subtracted (`ADVANTAGE_BASELINES`): ``"mean"``, the group mean (GRPO); ``"rloo"``, the mean
            of the K - 1 other completions (RLOO; K / (K - 1) times the ``"mean"`` advantage); ``"max"``, the group's
            best return (every advantage <= 0); ``"none"``, nothing (the raw returns, REINFORCE).

    >>> group_advantages(torch.tensor([[1.0, 3.0]]), "none")
    tensor([[-1.,  1.]])
    >>> group_advantages(torch.tensor([[1.0, 2.0, 6.0]]), "none", baseline="rloo")
    tensor([[-3.0000, -1.5000,  4.5000]])
    >>> group_advantages(torch.tensor([[1.0, 3.0]]), "none", baseline="max"), group_advantages(torch.tensor([[1.0, 3.0]]), "none", baseline="none")
    (tensor([[-2.,  0.]]), tensor([[1., 3.]]))
    """
    if returns.dim() != 2:
        raise ValueError(f"group_advantages expects a (groups, K) tensor, got shape {tuple(returns.shape)}.")
    k = returns.size(1)
    if baseline == "mean" or (baseline == "rloo" and k == 1):
        centred = returns - returns.mean(dim=1, keepdim=True)
    elif baseline == "rloo":
        centred = (returns * k - returns.sum(dim=1, keepdim=True)) / (k - 1)
    elif baseline == "max":
        centred = returns - returns.max(dim=1, keepdim=True).values
    elif baseline == "none":
        centred = returns
    else:
        raise ValueError(f"advantage_baseline must be one of {ADVANTAGE_BASELINES}, got {baseline!r}.")
    if scale_rewards == "none":
        return centred
    if scale_rewards == "group":
        std = _std(returns, dim=1, keepdim=True)
    elif scale_rewards == "batch":
        std = _std(returns) if returns.numel() > 1 else torch.zeros(())
    else:
        raise ValueError(f"scale_rewards must be one of {SCALE_REWARDS}, got {scale_rewards!r}.")
    # A single completion per group (e.g. greedy evaluation) has no spread: its advantage is 0, not NaN.
    return centred / (torch.nan_to_num(std) + 1e-4)
