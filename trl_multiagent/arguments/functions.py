"""The user's functions (the rewards, the transition, the formatters), checked against the team and the datasets
before anything is loaded: signatures, counts, columns, turns."""

from __future__ import annotations

from dataclasses import dataclass

from transformers.utils import logging

from ..callables import Transition, callable_name
from ..rewards.joint import REWARD_KEYWORDS, JointReward, resolve_weights
from ..rewards.models import reward_name
from ..rewards.wrappers import each_agent
from .datasets import (
    check_column_names,
    check_dataset,
    check_dataset_fills_a_step,
    is_conversational_dataset,
    named_eval_datasets,
)


logger = logging.get_logger(__name__)


@dataclass
class UserFunctions:
    joint_reward: JointReward
    transition: Transition | None
    formatters: list | None


def user_functions(
    args,
    num_agents: int,
    reward_funcs,
    external_transition,
    formatters,
    train_dataset,
    eval_dataset,
    world_rewards: list | None = None,
    has_worlds: bool = False,
) -> UserFunctions:
    """The reward functions, the transition and the formatters, checked against the team and the datasets before
    anything is loaded: signatures, counts, columns, turns. `world_rewards` are the environments' `get_reward` columns,
    after the user's functions (weight 1 unless `reward_weights` gives one for them too: `rewards.resolve_weights`)."""
    funcs = (
        []
        if reward_funcs is None
        else list(reward_funcs)
        if isinstance(reward_funcs, (list, tuple))
        else [reward_funcs]
    )
    weights = resolve_weights(args.reward_weights, [reward_name(f) for f in funcs], world_rewards or [])
    funcs += [each_agent(f) if f.per_agent_reward else f for f in world_rewards or []]
    named = [("train_dataset", train_dataset), *named_eval_datasets(eval_dataset)]
    columns = [c for _, d in named for c in (getattr(d, "column_names", None) or [])]
    columns = [c for c in columns if c != "prompt"]
    check_column_names(columns, {*REWARD_KEYWORDS, *Transition.REQUIRED, *Transition.HISTORY})
    joint_reward = JointReward(
        funcs, weights, num_agents, columns, args.agent_reward_aggregation, args.multi_objective_aggregation
    )
    if args.team_reward_weight != 1.0 and not joint_reward.gives_own_rewards:
        raise ValueError(
            f"MAGRPOConfig: team_reward_weight={args.team_reward_weight} mixes each agent's own reward into the team's, "
            f"but none of the reward functions {joint_reward.names} gives one: each is joint. Add a reward in TRL's "
            "per-agent convention (`f(completions, **kwargs)`, or wrap it in `trl_multiagent.per_agent`), set "
            "`per_agent_reward = True` on an environment class whose get_reward() returns one value per agent, or "
            "leave team_reward_weight at 1.0."
        )
    if callable(formatters):  # one formatter serves every agent
        formatters = [formatters] * num_agents
    if formatters is not None and len(formatters) != num_agents:
        raise ValueError(
            f"MAGRPOTrainer got {len(formatters)} formatters for {num_agents} agents; pass one per agent."
        )
    for name, dataset in named:
        check_dataset(name, dataset, formatters is not None, has_worlds)
    if train_dataset is not None and next(iter(train_dataset), None) is None:  # an iterable one: read its first row
        raise ValueError("MAGRPOTrainer: train_dataset is empty (no row); it needs at least one prompt.")
    check_dataset_fills_a_step(train_dataset, args)
    if args.num_turns > 1 and external_transition is None:
        raise ValueError(
            f"MAGRPOTrainer: num_turns={args.num_turns} needs `external_transition` to write the next prompts."
        )
    if args.num_turns == 1 and external_transition is not None:
        logger.warning_once(
            f"MAGRPOTrainer: external_transition {callable_name(external_transition)!r} is never called with "
            "num_turns=1: it writes the prompts of turn 2 and later. Set `num_turns` above 1 to use it."
        )
    conversational = is_conversational_dataset(train_dataset if train_dataset is not None else eval_dataset)
    transition = (
        Transition(external_transition, num_agents, conversational, columns)
        if external_transition is not None
        else None
    )
    return UserFunctions(joint_reward, transition, list(formatters) if formatters is not None else None)
