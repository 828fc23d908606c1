"""The credit options of `MAGRPOConfig` as strategies, one registry per field: each joint mode, baseline, scaling and
branching rule is one small object holding its rule, what it does and the paper it comes from.

`MAGRPOConfig` validates a choice by asking here (`check`, `check_branching`), so a new option is one entry in one
of these dicts. The trainer looks its config's choices up once (`rules_of`) and hands the strategies to the rollout and
`credit.assign`; the functions of `credit.returns` also take a name, checked and looked up (`strategy`).

>>> BASELINES["rloo"].paper
'RLOO: Ahmadian et al., Back to Basics, arXiv 2402.14740'
>>> check("advantage_baseline", "median")
Traceback (most recent call last):
...
ValueError: MAGRPOConfig: advantage_baseline must be one of ('mean', 'rloo', 'max', 'none'), got 'median'.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class JointMode:
    """`MAGRPOConfig.joint_mode`: which choices of one completion per agent at a node are the joint actions."""

    choices: Callable[[int, int], list[tuple[int, ...]]]  # (num_agents, K) -> one completion index per agent, each
    doc: str
    paper: str


@dataclass(frozen=True)
class Baseline:
    """`MAGRPOConfig.advantage_baseline`: what each completion's return is compared with, within its group (one
    agent's K completions at one node)."""

    centred: Callable[[torch.Tensor], torch.Tensor]  # (groups, K) returns -> returns minus the baseline
    doc: str
    paper: str


@dataclass(frozen=True)
class Scaling:
    """`MAGRPOConfig.scale_rewards`: how the centred returns become advantages (TRL's: divided by a std of the
    returns, plus 1e-4)."""

    scaled: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (groups, K) centred, returns -> advantages
    doc: str
    paper: str
    per_agent: bool = False  # `scaled` sees one agent's groups at a time (`returns.team_advantages` splits the team)


@dataclass(frozen=True)
class Branching:
    """`MAGRPOConfig.branching`: how many joint actions of a node that goes on continue to the next turn."""

    kept: Callable[[int, int | None], int]  # (the node's joint actions, branching_top_m) -> how many continue
    doc: str
    paper: str
    uses_top_m: bool = False  # reads `branching_top_m` (>= 1); the others refuse one, which they would ignore


def _rloo(returns: torch.Tensor) -> torch.Tensor:
    k = returns.size(1)
    if k == 1:  # no "others": the mean, as CoMLRL does
        return returns - returns.mean(dim=1, keepdim=True)
    return (returns * k - returns.sum(dim=1, keepdim=True)) / (k - 1)


def _std(x: torch.Tensor, dim=None, keepdim=False) -> torch.Tensor:
    # Bessel-corrected, like TRL's `nanstd`, so one agent and one turn reproduce GRPOTrainer's advantages exactly.
    return x.std(dim=dim, keepdim=keepdim) if dim is not None else x.std()


def _batch_std(returns: torch.Tensor) -> torch.Tensor:
    return _std(returns) if returns.numel() > 1 else torch.zeros(())


def _divided_by(std: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """TRL's scaling: the centred returns over `std` of the returns, plus 1e-4. A single completion per group (e.g.
    greedy evaluation) has no spread: its std is 0, not NaN."""
    return lambda centred, returns: centred / (torch.nan_to_num(std(returns)) + 1e-4)


def group_zscore(centred: torch.Tensor, returns: torch.Tensor) -> torch.Tensor:
    """Each group's centred returns standardised: minus their own mean, over their population std clamped at 1e-6
    (a group of one is left as it is). Whatever the baseline subtracted, only its spread is left, so every baseline
    gives the same advantages.

    >>> returns = torch.tensor([[0.2, 0.5, 0.9, 0.4]])
    >>> group_zscore(returns - returns.max(), returns).round(decimals=2)
    tensor([[-1.1800,  0.0000,  1.5700, -0.3900]])
    >>> group_zscore(torch.tensor([[0.7, 0.7]]), None), group_zscore(torch.tensor([[0.7]]), None)
    (tensor([[0., 0.]]), tensor([[0.7000]]))
    """
    if centred.size(1) < 2:
        return centred
    mean, std = zscore_scale(centred)
    return (centred - mean) / std


def zscore_scale(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`group_zscore`'s scale of each row of `values`: its mean, and its population std clamped at 1e-6.

    >>> zscore_scale(torch.tensor([[1.0, 3.0], [2.0, 2.0]]))
    (tensor([[2.],
            [2.]]), tensor([[1.0000e+00],
            [1.0000e-06]]))
    """
    return values.mean(dim=-1, keepdim=True), values.std(dim=-1, keepdim=True, unbiased=False).clamp(min=1e-6)


MAGRPO = "MAGRPO: Liu et al., LLM Collaboration With Multi-Agent Reinforcement Learning, arXiv 2508.04652"
GRPO = "GRPO: Shao et al., DeepSeekMath, arXiv 2402.03300"
AT_GRPO = "AT-GRPO (PettingLLMs): arXiv 2510.11062"
DR_MAS = "Dr. MAS: arXiv 2602.08847"

JOINT_MODES = {
    "aligned": JointMode(
        lambda num_agents, k: [(j,) * num_agents for j in range(k)],
        "the j-th completions of all agents form joint action j: K joint actions per node",
        MAGRPO,
    ),
    "cross": JointMode(
        lambda num_agents, k: list(itertools.product(range(k), repeat=num_agents)),
        "every combination of the agents' completions: K**N joint actions per node",
        MAGRPO,
    ),
}
BASELINES = {
    "mean": Baseline(lambda r: r - r.mean(dim=1, keepdim=True), "the group mean", GRPO),
    "rloo": Baseline(
        _rloo,
        "the mean of the K - 1 other completions (K / (K - 1) times the 'mean' advantage)",
        "RLOO: Ahmadian et al., Back to Basics, arXiv 2402.14740",
    ),
    "max": Baseline(
        lambda r: r - r.max(dim=1, keepdim=True).values,
        "the group's best return (every advantage <= 0)",
        "CoMLRL 1.4.3 (no paper)",
    ),
    "none": Baseline(lambda r: r, "nothing: the raw returns", "REINFORCE: Williams, 1992"),
}
SCALINGS = {  # TRL's three, "agent" and "group_zscore"
    "group": Scaling(
        _divided_by(lambda r: _std(r, dim=1, keepdim=True)), "divided by each group's std (TRL's default)", GRPO
    ),
    "batch": Scaling(
        _divided_by(_batch_std),
        "divided by the std of every return in the batch, every agent's",
        "PPO Lite (as TRL cites): arXiv 2508.08221",
    ),
    "agent": Scaling(
        _divided_by(_batch_std), "divided by the std of the agent's own returns in the batch", DR_MAS, per_agent=True
    ),
    "group_zscore": Scaling(
        group_zscore,
        "each group's centred returns standardised: minus their mean, over their population std (at least 1e-6)",
        "CoMLRL 1.4.3's MAGRPO (no paper)",
    ),
    "none": Scaling(lambda centred, returns: centred, "no scaling", "Dr. GRPO (as TRL cites): arXiv 2503.20783"),
}
BRANCHINGS = {
    "all": Branching(lambda choices, top_m: choices, "every joint action: K + K**2 + ... + K**T completions", MAGRPO),
    "best": Branching(lambda choices, top_m: 1, "the one with the highest joint reward: K * T completions", AT_GRPO),
    "top": Branching(lambda choices, top_m: min(top_m, choices), "the branching_top_m best", AT_GRPO, uses_top_m=True),
}

REGISTRIES = {
    "joint_mode": JOINT_MODES,
    "advantage_baseline": BASELINES,
    "scale_rewards": SCALINGS,
    "branching": BRANCHINGS,
}
# GRPOConfig maps True and False to "group" and "none" before the config checks the field
ALSO_ACCEPTED = {"scale_rewards": " (or True for 'group', False for 'none')"}


def check(field: str, name) -> JointMode | Baseline | Scaling | Branching:
    """The strategy `name` of the `MAGRPOConfig` field `field`, or the error that names the field, its choices and
    the value got.

    >>> check("scale_rewards", "agent").per_agent
    True
    """
    registry = REGISTRIES[field]
    if name not in registry:
        raise ValueError(
            f"MAGRPOConfig: {field} must be one of {tuple(registry)}{ALSO_ACCEPTED.get(field, '')}, got {name!r}."
        )
    return registry[name]


def check_branching(name, top_m: int | None) -> Branching:
    """The branching rule `name` with its `branching_top_m`: `>= 1` where the rule reads it, `None` where it does not
    (there it would be ignored).

    >>> check_branching("best", 2)
    Traceback (most recent call last):
    ...
    ValueError: MAGRPOConfig: branching_top_m=2 applies to branching='top' only; with branching='best' it would be ignored. Set branching='top', or leave branching_top_m None.
    """
    branching = check("branching", name)
    if branching.uses_top_m and (top_m is None or top_m < 1):
        raise ValueError(
            f"MAGRPOConfig: branching={name!r} needs branching_top_m >= 1 (how many joint answers of each node "
            f"continue), got {top_m!r}."
        )
    if not branching.uses_top_m and top_m is not None:
        readers = " or ".join(f"branching={other!r}" for other, rule in BRANCHINGS.items() if rule.uses_top_m)
        raise ValueError(
            f"MAGRPOConfig: branching_top_m={top_m} applies to {readers} only; with branching={name!r} it would be "
            f"ignored. Set {readers}, or leave branching_top_m None."
        )
    return branching


STRATEGIES = (JointMode, Baseline, Scaling, Branching)


def strategy(field: str, choice, top_m: int | None = None) -> JointMode | Baseline | Scaling | Branching:
    """`choice` for the `MAGRPOConfig` field `field` as its strategy: a strategy as it is (looked up already, as the
    trainer's `CreditRules`), a name checked and looked up (`check`; a branching rule with its `top_m`,
    `check_branching`).

    >>> strategy("branching", BRANCHINGS["best"]) is strategy("branching", "best") is BRANCHINGS["best"]
    True
    """
    if isinstance(choice, STRATEGIES):
        return choice
    return check_branching(choice, top_m) if field == "branching" else check(field, choice)


@dataclass(frozen=True)
class CreditRules:
    """A config's credit fields, each option as its strategy: looked up once when the trainer is built (`rules_of`)
    and handed to the rollout (`joint_mode`, `branching`) and to `credit.assign` (the rest), so that nothing is looked
    up, or checked, per node or per step."""

    joint_mode: JointMode
    branching: Branching
    branching_top_m: int | None
    baseline: Baseline
    scaling: Scaling  # `MAGRPOConfig.advantage_scale`'s: `scale_rewards`, or "batch" under normalize_then_sum
    discount: float
    team_reward_weight: float


def rules_of(args) -> CreditRules:
    """The credit fields of `args` (a `MAGRPOConfig` whose `check` refused any name these registries lack) as their
    strategies."""
    return CreditRules(
        joint_mode=JOINT_MODES[args.joint_mode],
        branching=BRANCHINGS[args.branching],
        branching_top_m=args.branching_top_m,
        baseline=BASELINES[args.advantage_baseline],
        scaling=SCALINGS[args.advantage_scale],
        discount=args.discount,
        team_reward_weight=args.team_reward_weight,
    )
