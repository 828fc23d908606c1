"""Credit assignment for MAGRPO: returns over the rollout tree and per-agent group advantages.

`assign(tree, rules)` is the one entry point: a grown `RolloutTree` and the config's credit fields (`CreditRules`) in,
every joint action's return and every completion's credited return and advantage out. The rest are plain functions over
lists and tensors, so each can be checked by hand without a model. The options (joint mode, baseline, scaling,
branching) are strategies of `credit.options`: each function takes one as the trainer looked it up once, or its name.

Vocabulary (see `rollout.RolloutTree`):

- a *node* is one state of the team: one prompt per agent. Every agent writes K completions at a node.
- a *joint action* is one choice of completion per agent at a node: in ``"aligned"`` mode the j-th completion of every
  agent (K joint actions); in ``"cross"`` mode every combination (K**N joint actions).
- a joint action that is expanded leads to one child node at the next turn.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from .options import Baseline, Branching, CreditRules, JointMode, Scaling, strategy


def joint_choices(num_agents: int, num_generations: int, joint_mode: str | JointMode) -> list[tuple[int, ...]]:
    """The joint actions of one node, as one completion index per agent.

    >>> joint_choices(2, 3, "aligned")
    [(0, 0), (1, 1), (2, 2)]
    >>> joint_choices(2, 2, "cross")
    [(0, 0), (0, 1), (1, 0), (1, 1)]
    """
    return strategy("joint_mode", joint_mode).choices(num_agents, num_generations)


def expanded_per_node(num_choices: int, branching: str | Branching, top_m: int | None = None) -> int:
    """How many joint actions of a node that goes on are continued (`MAGRPOConfig.branching`).

    >>> expanded_per_node(4, "all"), expanded_per_node(4, "best"), expanded_per_node(4, "top", 2), expanded_per_node(4, "top", 9)
    (4, 1, 2, 4)
    """
    return strategy("branching", branching, top_m).kept(num_choices, top_m)


def continued(rewards: Sequence[float], branching: str | Branching, top_m: int | None = None) -> list[int]:
    """Positions of a node's joint actions that continue, in their original order: every one, or the highest
    rewards (ties go to the earlier joint action, so the choice is the same on every run and process).

    >>> continued([0.2, 0.9, 0.5, 0.9], "all"), continued([0.2, 0.9, 0.5, 0.9], "best"), continued([0.2, 0.9, 0.5, 0.9], "top", 2)
    ([0, 1, 2, 3], [1], [1, 3])
    """
    keep = expanded_per_node(len(rewards), branching, top_m)
    ranked = sorted(range(len(rewards)), key=lambda j: (-rewards[j], j))
    return sorted(ranked[:keep])


def joint_returns(
    rewards: Sequence[float],
    children: Sequence[Sequence[int]],
    discount: float = 1.0,
    pruned: dict[int, Sequence[int]] | None = None,
) -> list[float]:
    """Return of every joint action: ``reward + discount * mean(return of the child node's joint actions)``.

    A joint action that branching did not continue (`pruned`) has no child of its own. Its future is estimated by
    its node's continued joint actions: ``reward + discount * mean(future of each continued sibling)``. So within a
    node, every joint action carries the same future and siblings differ by their own reward, as in AT-GRPO's
    per-turn groups; and with every joint action continued nothing changes.

    Args:
        rewards: the joint reward of each joint action, indexed by joint-action id.
        children: for each joint action, the ids of the joint actions of the node it expanded into (empty when the
            branch ended there). A child always has a larger id than its parent, as rollouts create them later.
        discount: weight of the future, 1.0 by default.
        pruned: joint-action id -> the ids of the siblings that were continued in its place.

    >>> joint_returns([1.0, 0.0, 0.5, 1.5], [[2, 3], [], [], []], discount=0.5)
    [1.5, 0.0, 0.5, 1.5]

    Best-only branching: joint action 0 (reward 1.0) was continued; 1 (reward 0.0) was not. Its return is its own
    reward plus the future of 0, ``0.0 + 0.5 * mean(0.5, 1.5) = 0.5``:

    >>> joint_returns([1.0, 0.0, 0.5, 1.5], [[2, 3], [], [], []], discount=0.5, pruned={1: [0]})
    [1.5, 0.5, 0.5, 1.5]
    """
    if len(rewards) != len(children):
        raise ValueError(f"joint_returns: {len(rewards)} rewards but {len(children)} children lists.")
    pruned = pruned or {}
    returns = [0.0] * len(rewards)

    def future(a: int) -> float:
        kids = children[a]
        if any(c <= a for c in kids):
            raise ValueError(f"joint_returns: joint action {a} has a child id <= its own: {list(kids)}.")
        return sum(returns[c] for c in kids) / len(kids) if kids else 0.0

    for a in reversed(range(len(rewards))):
        if a in pruned:
            if children[a] or not pruned[a]:
                raise ValueError(f"joint_returns: pruned joint action {a} needs no children and a continued sibling.")
            estimate = sum(future(s) for s in pruned[a]) / len(pruned[a])
        else:
            estimate = future(a)
        returns[a] = float(rewards[a]) + discount * estimate
    return returns


def mixed_rewards(
    team: Sequence[float], own: Sequence[Sequence[float] | None], team_weight: float
) -> list[list[float]]:
    """Each agent's reward per joint action (PettingLLMs' mix): ``team_weight * team + (1 - team_weight) * own``.

    Args:
        team: the joint reward of each joint action.
        own: per joint action, each agent's own reward, or None where the joint action has none (the team's then).
        team_weight: alpha in [0, 1].

    Returns:
        ``[agent][joint action]``.

    >>> mixed_rewards([1.0, 0.0], [[0.0, 2.0], None], team_weight=0.75)
    [[0.75, 0.0], [1.25, 0.0]]
    """
    num_agents = max((len(o) for o in own if o is not None), default=1)
    return [
        [
            float(t) if o is None else team_weight * float(t) + (1.0 - team_weight) * float(o[i])
            for t, o in zip(team, own, strict=True)
        ]
        for i in range(num_agents)
    ]


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


def team_advantages(
    credited: torch.Tensor, scale_rewards: str | Scaling = "group", baseline: str | Baseline = "mean"
) -> torch.Tensor:
    """Advantages of a whole rollout's ``(nodes, agents, K)`` credited returns: `group_advantages` over every group
    (one agent at one node), with ``scale_rewards="agent"`` dividing each agent's groups by the std of that agent's
    own returns (Dr. MAS) where ``"batch"`` divides by the std of every agent's.

    Agent 1's returns are agent 0's times 10. Divided by the std of every return ("batch"), its advantages are 10
    times agent 0's; divided by its own ("agent"), both agents' advantages are the same:

    >>> credited = torch.tensor([[[0.0, 2.0], [0.0, 20.0]], [[1.0, 3.0], [10.0, 30.0]]])  # (2 nodes, 2 agents, K=2)
    >>> team_advantages(credited, "batch")[0].round(decimals=2)
    tensor([[-0.0900,  0.0900],
            [-0.9000,  0.9000]])
    >>> team_advantages(credited, "agent")[0].round(decimals=2)
    tensor([[-0.7700,  0.7700],
            [-0.7700,  0.7700]])
    """
    if credited.dim() != 3:
        raise ValueError(f"team_advantages expects a (nodes, agents, K) tensor, got shape {tuple(credited.shape)}.")
    scaling, baseline = strategy("scale_rewards", scale_rewards), strategy("advantage_baseline", baseline)
    if not scaling.per_agent:
        return group_advantages(credited.flatten(0, 1), scaling, baseline).view_as(credited)
    per_agent = [group_advantages(credited[:, i], scaling, baseline) for i in range(credited.size(1))]
    return torch.stack(per_agent, dim=1)


def agent_completion_returns(
    choices: Sequence[tuple[int, ...]], agent_returns: Sequence[Sequence[float]], num_generations: int
) -> torch.Tensor:
    """`completion_returns` where each agent has returns of its own (a reward mix): row i credits agent i's
    completions from agent i's returns of the node's joint actions.

    >>> agent_completion_returns([(0, 0), (1, 1)], [[1.0, 2.0], [5.0, 6.0]], 2)
    tensor([[1., 2.],
            [5., 6.]])
    """
    num_agents = len(agent_returns)
    rows = [
        completion_returns(choices, returns, num_agents, num_generations)[i] for i, returns in enumerate(agent_returns)
    ]
    return torch.stack(rows)


def group_advantages(
    returns: torch.Tensor, scale_rewards: str | Scaling = "group", baseline: str | Baseline = "mean"
) -> torch.Tensor:
    """Advantages for groups of K completions: ``r - baseline(group)``, scaled: TRL's ``/ (std + 1e-4)``, or
    standardised (``"group_zscore"``).

    Args:
        returns: ``(num_groups, K)``; one group is one agent's K completions at one node.
        scale_rewards: how the centred returns are scaled, a `credit_options.SCALINGS` entry or its name (a
            per-agent one, ``"agent"``, sees ``returns`` as one agent's: `team_advantages` passes them so).
        baseline: what is subtracted, a `credit_options.BASELINES` entry or its name.

    >>> group_advantages(torch.tensor([[1.0, 3.0]]), "none")
    tensor([[-1.,  1.]])
    >>> group_advantages(torch.tensor([[1.0, 2.0, 6.0]]), "none", baseline="rloo")
    tensor([[-3.0000, -1.5000,  4.5000]])
    >>> group_advantages(torch.tensor([[1.0, 3.0]]), "none", baseline="max"), group_advantages(torch.tensor([[1.0, 3.0]]), "none", baseline="none")
    (tensor([[-2.,  0.]]), tensor([[1., 3.]]))

    TRL's `"group"` divides the centred returns by the returns' std; `"group_zscore"` re-centres them first, so the
    baseline no longer matters:

    >>> group_advantages(torch.tensor([[0.2, 0.5, 0.9, 0.4]]), "group", baseline="none").round(decimals=2)
    tensor([[0.6800, 1.7000, 3.0600, 1.3600]])
    >>> group_advantages(torch.tensor([[0.2, 0.5, 0.9, 0.4]]), "group_zscore", baseline="none").round(decimals=2)
    tensor([[-1.1800,  0.0000,  1.5700, -0.3900]])
    """
    if returns.dim() != 2:
        raise ValueError(f"group_advantages expects a (groups, K) tensor, got shape {tuple(returns.shape)}.")
    centred = strategy("advantage_baseline", baseline).centred(returns)
    return strategy("scale_rewards", scale_rewards).scaled(centred, returns)


class Credit(NamedTuple):
    """What `assign` gives the update and the logs."""

    returns: list[float]  # the team's return of every joint action
    credited: torch.Tensor  # (nodes, agents, K): the return credited to each completion, from its agent's reward
    advantages: torch.Tensor  # (nodes, agents, K)


def assign(tree, rules: CreditRules) -> Credit:
    """Returns and advantages of a grown rollout tree (`rollout.RolloutTree`), with the config's `discount`,
    `team_reward_weight`, scaling (`advantage_scale`: `scale_rewards`, or "batch" under `normalize_then_sum`) and
    baseline, as the trainer looked them up (`credit.options.rules_of`): `tree_returns`, then `agent_tree_returns`,
    `credited_returns` and `team_advantages`.

    The tree comes in as data (its `nodes`, `joint_actions`, `children()` and `pruned()`): credit sits below the
    rollout, so it imports nothing of it."""
    credited = credited_returns(tree, agent_tree_returns(tree, rules.discount, rules.team_reward_weight))
    advantages = team_advantages(credited, rules.scaling, rules.baseline)
    return Credit(tree_returns(tree, rules.discount), credited, advantages)


def tree_returns(tree, discount: float) -> list[float]:
    """The team's return of every joint action of `tree` (`joint_returns` over its joint rewards)."""
    return joint_returns([a.learned_reward for a in tree.joint_actions], tree.children(), discount, tree.pruned())


def agent_tree_returns(tree, discount: float, team_weight: float = 1.0) -> list[list[float]]:
    """Per agent, the return of every joint action of `tree` from that agent's reward: the team's, or with
    `team_weight` below 1 and per-agent rewards, `mixed_rewards`."""
    num_agents = len(tree.nodes[0].completions) if tree.nodes else 0
    own = [a.own_rewards for a in tree.joint_actions]
    if team_weight == 1.0 or all(o is None for o in own):
        return [tree_returns(tree, discount)] * num_agents
    children, pruned = tree.children(), tree.pruned()
    mixed = mixed_rewards([a.learned_reward for a in tree.joint_actions], own, team_weight)
    return [joint_returns(rewards, children, discount, pruned) for rewards in mixed]


def credited_returns(tree, agent_returns: Sequence[Sequence[float]]) -> torch.Tensor:
    """``(nodes, agents, K)``: the return credited to each completion of `tree`, from its own agent's returns
    (`agent_completion_returns` at each node)."""
    tables = []
    for node in tree.nodes:
        choices = [tree.joint_actions[a].choice for a in node.joint_actions]
        per_agent = [[returns[a] for a in node.joint_actions] for returns in agent_returns]
        tables.append(agent_completion_returns(choices, per_agent, len(node.completions[0])))
    return torch.stack(tables)
