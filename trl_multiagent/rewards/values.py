"""What a reward function returned, checked: one float (or None) per joint action (`check_rewards`), or, for a
function that gives each agent its own reward, one list of N per joint action (`check_agent_rewards`). An error names
the function, the turn and what it returned."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

from ..callables import short_repr


def check_agent_rewards(name: str, values: Any, count: int, num_agents: int, turn: int) -> list[list[float | None]]:
    """An `each_agent` function's values, one list of `num_agents` numbers (or None) per joint action, as
    ``[agent][joint action]``; or a clear error naming the function, the turn and what it returned.

    >>> check_agent_rewards("referee", [[1, 2], None], 2, 2, 1)
    [[1.0, None], [2.0, None]]
    """

    def is_list(value, length: int) -> bool:
        return isinstance(value, Sequence) and not isinstance(value, (str, bytes)) and len(value) == length

    where = f"Reward function {name!r} (turn {turn}) gives each agent its own reward, so it"
    if not is_list(values, count):
        raise ValueError(
            f"{where} must return a list of {count} entries, one per joint action, each a list of {num_agents} "
            f"numbers (one per agent) or None; got {short_repr(values, 80)}."
        )
    per_agent: list[list[float | None]] = [[] for _ in range(num_agents)]
    for j, row in enumerate(values):
        if row is not None and not is_list(row, num_agents):
            raise ValueError(
                f"{where} must give each joint action a list of {num_agents} numbers, one per agent (or None); got "
                f"{short_repr(row, 80)} at joint action {j}."
            )
        checked = (
            [None] * num_agents if row is None else check_rewards(f"{name}, joint action {j}", row, num_agents, turn)
        )
        for i, value in enumerate(checked):
            per_agent[i].append(value)
    return per_agent


def check_rewards(name: str, values: Any, count: int, turn: int, how: str = "", joint: bool = False) -> list:
    """The values as floats (None kept), or a clear error naming the function, the turn (and `how` it was called) and
    what it returned. `joint`: a joint function's call, which a bare number shows to score one joint action per call."""
    where = f"Reward function {name!r} (turn {turn}{how})"
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) and not hasattr(values, "tolist"):
        hint = ""
        if joint and isinstance(values, numbers.Real) and count > 1:
            hint = f" If it scores one joint action per call, wrap it: per_joint_action({name})."
        raise TypeError(
            f"{where} must return a list of {count} floats, one per joint action; got {short_repr(values)}.{hint}"
        )
    values = values.tolist() if hasattr(values, "tolist") else list(values)
    if len(values) != count:
        hint = ""
        if joint and len(values) == 1 and count > 1:
            hint = f" If it scores one joint action per call, wrap it: per_joint_action({name})."
        raise ValueError(
            f"{where} returned {len(values)} value{'s' if len(values) != 1 else ''} for {count} joint "
            f"action{'s' if count != 1 else ''}; it must return one per joint action. Got: {short_repr(values)}.{hint}"
        )
    out = []
    for j, v in enumerate(values):
        if v is None:
            out.append(None)
            continue
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise TypeError(f"{where} returned a non-number at index {j}: {v!r} (all values: {short_repr(values)}).")
        if math.isnan(v) or math.isinf(v):
            raise ValueError(f"{where} returned {v} at index {j}; rewards must be finite (all: {short_repr(values)}).")
        out.append(float(v))
    return out
