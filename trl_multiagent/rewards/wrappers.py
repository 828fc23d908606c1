"""The wrappers that state a reward function's convention: `joint`, `per_agent`, `per_joint_action` and `each_agent`
(what each convention is called with: `rewards.joint`). A wrapped function keeps its name and signature, and is
sync or async as it was; `stated_convention` reads what a wrapper states.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable

import torch

from ..callables import callable_name, short_repr


_CONVENTION = "__trl_multiagent_convention__"  # the attribute a wrapper sets (`stated_convention` reads it)


def joint(func: Callable) -> Callable:
    """State that `func` is a joint reward: ``func(completions_agent_0, completions_agent_1, ...)``, one list of
    completions per agent aligned by joint action (a function with one positional parameter gets one list of the
    agents' lists; one whose parameters are all keywords the trainer passes, such as TRL's ``f(environments,
    **kwargs)``, gets no list and is called by keywords), returning one value per joint action (the default for a function
    that names no completions).

    >>> @joint
    ... def same_length(completions_0, completions_1):
    ...     return [float(len(a) == len(b)) for a, b in zip(completions_0, completions_1)]
    >>> from trl_multiagent.rewards.joint import JointReward
    >>> total, _, _ = JointReward([same_length], None, num_agents=2)([["ab", "c"], ["xy", "zz"]], 1, {})
    >>> total
    [1.0, 0.0]
    """
    return _stated(func, "joint")


def per_agent(func: Callable) -> Callable:
    """State that `func` is a per-agent reward in TRL's convention, ``func(completions, **kwargs)`` called by keywords
    (``prompts``, ``completions``, ``completion_ids``, the dataset columns, ...; the ones it names): it scores one
    agent's completions and is called once per agent; `MAGRPOConfig.agent_reward_aggregation` (mean by default) makes
    the joint reward of the agents' values.

    >>> @per_agent
    ... def length(completions):
    ...     return [float(len(c)) for c in completions]
    >>> from trl_multiagent.rewards.joint import JointReward
    >>> total, _, by_agent = JointReward([length], None, num_agents=2)([["ab", "c"], ["wxyz", "z"]], 1, {})
    >>> total, by_agent[0]
    ([3.0, 1.0], [[2.0, 1.0], [4.0, 1.0]])
    """
    return _stated(func, "per_agent")


def per_joint_action(func: Callable) -> Callable:
    """State that `func` scores one joint action per call: it is called once per joint action with one-element lists (``completions_agent_i[0]``), ``rows=[row]`` and ``prompts=[agent 0's
    prompt]``, and returns one value or a list of one value.

    >>> @per_joint_action
    ... def agree(completions_0, completions_1):
    ...     return 1.0 if completions_0[0] == completions_1[0] else 0.0
    >>> from trl_multiagent.rewards.joint import JointReward
    >>> total, _, _ = JointReward([agree], None, num_agents=2)([["a", "b"], ["a", "c"]], 1, {})
    >>> total
    [1.0, 0.0]
    """
    return _stated(func, "per_joint_action")


def each_agent(func: Callable) -> Callable:
    """State that the joint function `func` returns, per joint action, one value per agent (agent i's own reward)
    instead of one team value. The team's value is their aggregate (`MAGRPOConfig.agent_reward_aggregation`), and
    `MAGRPOConfig.team_reward_weight` below 1 mixes each agent's own value into what it learns from. An environment's
    ``get_reward()`` is read this way when its class sets ``per_agent_reward = True`` (`environments.worlds`).

    >>> @each_agent
    ... def referee(completions_0, completions_1):
    ...     return [[float(len(a)), float(len(b))] for a, b in zip(completions_0, completions_1)]
    >>> from trl_multiagent.rewards.joint import JointReward
    >>> reward = JointReward([referee], None, num_agents=2)
    >>> total, per_func, by_agent = reward([["ab"], ["wxyz"]], 1, {})
    >>> total, reward.own_rewards(per_func, by_agent, 1)
    ([3.0], [[2.0, 4.0]])
    """
    return _stated(func, "each_agent")


def _stated(func: Callable, convention: str) -> Callable:
    """`func` behind a wrapper that carries its convention (sync or async as `func` is); its name and signature are
    `func`'s."""
    if isinstance(func, (str, torch.nn.Module)) or not callable(func):
        raise TypeError(
            f"{convention}(...) takes a reward function; got {type(func).__name__} {short_repr(func, 80)}. A reward model "
            "(a model or its id) is always per-agent: put it in `reward_funcs` as it is."
        )
    if inspect.iscoroutinefunction(func):

        async def stated(*args, **kwargs):
            return await func(*args, **kwargs)

    else:

        def stated(*args, **kwargs):
            return func(*args, **kwargs)

    functools.update_wrapper(stated, func)  # `__wrapped__`: `inspect.signature` reads `func`'s parameters
    stated.__name__ = callable_name(func)
    setattr(stated, _CONVENTION, convention)
    return stated


def stated_convention(func) -> str | None:
    """The convention a `joint`, `per_agent`, `per_joint_action` or `each_agent` wrapper states, or None (it is
    inferred)."""
    return getattr(func, _CONVENTION, None)
