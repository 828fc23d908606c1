"""CoMLRL 1.4.3's reward and transition calls, as the core calls a stated convention.

CoMLRL calls the joint reward once per joint action, with a one-element list per agent, `batch_items=[row]` when the
function takes it (or ``**kwargs``), the prompt by position or as `prompts=` by what the signature shows, and keeps
the first value of what it returns, through `reward_processor`. `comlrl_reward` makes that call from the core's
`per_joint_action` one. `comlrl_transition` calls the transition by keyword with its five names and, unless
`external_prompt_passthrough`, formats every later turn's prompts with the formatters.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable

import torch
from transformers.utils import logging

from ..callables import Transition, callable_name
from ..rewards.wrappers import per_joint_action


logger = logging.get_logger(__name__)


def _values(raw) -> list[float]:
    """What CoMLRL keeps of a reward's return: a tensor's or a sequence's values, or one number."""
    if isinstance(raw, torch.Tensor):
        return [float(v) for v in raw.detach().cpu().reshape(-1).tolist()]
    if isinstance(raw, (list, tuple)):
        return [float(v) for v in raw]
    return [float(raw)]


def _arguments(signature: inspect.Signature, num_agents: int, prompts: list, completions: list) -> tuple[list, bool]:
    """CoMLRL's positional arguments for a signature, and whether the prompts are among them."""
    params = list(signature.parameters.values())
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return list(completions), False
    count = sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)
    if num_agents == 1:
        return ([completions[0]], False) if count == 1 else ([prompts, completions[0]], True)
    if count == num_agents + 1:
        return [prompts, *completions], True
    if count == 1:
        return [list(completions)], False
    return list(completions), False


def comlrl_call(func: Callable, num_agents: int) -> Callable[..., list[float]]:
    """`func` called as CoMLRL calls a reward of `num_agents` agents, on one-element completion lists: by its
    signature's positional count (`_arguments`), `batch_items=rows` and `prompts=` where it takes them, and on a
    `TypeError` with the completion lists alone. Returns what CoMLRL keeps of the return: its values, as floats."""
    signature = inspect.signature(func)
    params = signature.parameters
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())

    def values(*completions, prompts=None, rows=None) -> list[float]:
        args, prompts_given = _arguments(signature, num_agents, prompts, list(completions))
        keywords = {}
        if rows is not None and ("batch_items" in params or takes_any):
            keywords["batch_items"] = rows
        if not prompts_given and ("prompts" in params or takes_any):
            keywords["prompts"] = prompts
        try:
            raw = func(*args, **keywords)
        except TypeError:  # CoMLRL's fallback: the completion lists alone
            raw = func(*completions)
        return _values(raw)

    return values


def comlrl_reward(func: Callable, num_agents: int, reward_processor: Callable[[float], float] | None) -> Callable:
    """`func` called as CoMLRL calls a reward (`comlrl_call`), stated to the core as `per_joint_action`: one joint
    action per call, its first value kept, through `reward_processor`. Named as `func`."""
    values = comlrl_call(func, num_agents)

    def call(*completions, prompts=None, rows=None):
        value = values(*completions, prompts=prompts, rows=rows)[0]
        if reward_processor is None:
            return [value]
        processed = reward_processor(value)
        if not math.isfinite(processed):
            raise ValueError(
                f"reward_processor {callable_name(reward_processor)!r} returned {processed} for the value {value} of "
                f"reward function {callable_name(func)!r}; rewards must be finite."
            )
        return [processed]

    call.__name__ = callable_name(func)
    call.__qualname__ = call.__name__
    call.__module__ = getattr(func, "__module__", __name__)
    return per_joint_action(call)


def comlrl_transition(func: Callable, formatters: list | None, passthrough: bool) -> Callable:
    """`func` called as CoMLRL calls a transition, by keyword with its five names; with `formatters` and not
    `passthrough`, each agent's next prompt is then formatted from the row with `prompt` set to the transition's (and
    `external_prompts=` when the formatter takes it), as CoMLRL formats every later turn."""

    def transition(
        prompt, agent_completions, num_agents, prompt_history_per_agent, response_history_per_agent, **columns
    ):
        prompts = func(
            prompt=prompt,
            agent_completions=agent_completions,
            num_agents=num_agents,
            prompt_history_per_agent=prompt_history_per_agent,
            response_history_per_agent=response_history_per_agent,
        )
        if formatters is None or passthrough or not isinstance(prompts, (list, tuple)):
            return prompts
        row = {**{k: v for k, v in columns.items() if k not in Transition.HISTORY}, "prompt": prompt}
        return [
            f({**row, "prompt": p}, external_prompts=p)
            if "external_prompts" in inspect.signature(f).parameters
            else f({**row, "prompt": p})
            for f, p in zip(formatters, prompts, strict=False)
        ]

    transition.__name__ = callable_name(func)
    return transition
