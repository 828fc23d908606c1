"""A reward function's convention read from its signature, when no wrapper states it (`rewards.wrappers`): TRL's
per-agent ``f(completions, **kwargs)`` (`is_per_agent`), how many completion lists a joint function takes
(`completion_slots`), and the WARNING, once per function, that says what was read and how to state it
(`say_inferred`).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import torch
from transformers.utils import logging

from ..callables import accepted_keywords
from .wrappers import stated_convention


logger = logging.get_logger(__name__)

PER_AGENT_NAMES = ("completions", "completion_ids")


def is_per_agent(func) -> bool:
    """TRL's convention: a reward model (id or module), a function wrapped in `per_agent`, or an unwrapped function
    naming `completions`/`completion_ids` and taking ``**kwargs``."""
    if isinstance(func, (str, torch.nn.Module)):
        return True
    if not callable(func):
        return False
    if stated_convention(func) is not None:
        return stated_convention(func) == "per_agent"
    names, takes_any = accepted_keywords(func)
    return takes_any and any(name in names for name in PER_AGENT_NAMES)


def say_inferred(
    func, name: str, per_agent: bool, one_list: bool, by_keywords: bool = False, num_agents: int = 2
) -> None:
    """Once per function, at WARNING: the convention read from its signature, and how to state it. A team of one reads
    TRL's per-agent convention as TRL does, with nothing to combine: nothing to say."""
    if stated_convention(func) is not None or isinstance(func, (str, torch.nn.Module)):
        return
    if by_keywords:
        logger.warning_once(
            f"Reward function {name!r}{inspect.signature(func)} names no completions, so it is read as a joint reward "
            "called by keywords only, once per turn: `environments` holds each joint action's world (with "
            "environment_factory; the world the whole team acted on), `prompts` each agent's prompts, and it returns "
            "one value per joint action (TRL's environment reward, `def reward_func(environments, **kwargs)`). State "
            f"it with joint({name}) (from trl_multiagent), or name `completions` and state per_agent({name}) to score "
            "each agent's completions (TRL's convention)."
        )
        return
    trl_own = (getattr(func, "__module__", None) or "").startswith("trl.")  # TRL's own rewards are per-agent
    if per_agent and not trl_own and num_agents > 1:
        logger.warning_once(
            f"Reward function {name!r} names `completions` or `completion_ids` and takes **kwargs, so it is read as "
            "TRL's per-agent convention: it will be called once per agent with that agent's completions, and "
            "MAGRPOConfig.agent_reward_aggregation combines the agents' values into the joint reward. State it with "
            f"per_agent({name}) (from trl_multiagent), or joint({name}) if it scores the agents' answers together."
        )
    elif one_list and not per_agent:
        logger.warning_once(
            f"Reward function {name!r} takes one positional parameter, so it is read as a joint reward called with "
            "one list of the agents' completion lists (`completions[i][j]` is agent i's answer in "
            f"joint action j), returning one value per joint action. State it with joint({name}) (from "
            f"trl_multiagent), or per_agent({name}) if it scores one agent's completions (TRL's convention)."
        )


def completion_slots(func, keywords: Sequence[str]) -> int | None:
    """How many completion lists a joint function takes by position: its leading required positional parameters up to
    the first one named like a keyword the trainer passes (or a dataset column), which is passed by name; None when it
    takes ``*args`` (any number).

    >>> completion_slots(lambda c0, c1, environments=None: 0, ["environments"])
    2
    >>> completion_slots(lambda environments, **kwargs: 0, ["environments"])
    0
    """
    params = inspect.signature(func).parameters.values()
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        return None
    slots = 0
    for p in params:
        if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) or p.name in keywords:
            break
        slots += p.default is p.empty
    return slots
