"""Did a run's reward improve? The first quarter of its steps against the last quarter, with a standard error.

Per-step rewards are noisy (a step scores a handful of joint answers), so the first and last logged values say little.
`quarter_change` compares the mean of the first quarter of the values with the mean of the last quarter; the standard
error of that difference comes from the step-to-step spread inside each quarter. A change larger than twice its
standard error is called an improvement (or a decline); anything inside is "no clear change".

    >>> change = quarter_change([0.30, 0.40, 0.35, 0.45, 0.50, 0.55, 0.60, 0.50])
    >>> round(change.first, 3), round(change.last, 3), round(change.change, 3), round(change.se, 3)
    (0.35, 0.55, 0.2, 0.071)
    >>> change.verdict
    'improved'
    >>> quarter_change([0.4, 0.5, 0.4]).verdict  # fewer than 8 values: no standard error
    'too few steps to tell'
    >>> smooth([0.0, 1.0, 0.0, 1.0, 0.0], 3)
    [0.5, 0.333..., 0.666..., 0.333..., 0.5]
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass


MIN_STEPS = 8  # two values per quarter at least, so that each quarter has a spread


def mean(values: Sequence[float]) -> float:
    """The mean, NaN for no values."""
    return sum(values) / len(values) if len(values) else float("nan")


def mean_and_se(values: Sequence[float]) -> tuple[float, float]:
    """The mean of the non-NaN values and its standard error (sample std / sqrt(n); NaN below 2 values)."""
    values = [v for v in values if not math.isnan(v)]
    if len(values) < 2:
        return mean(values), float("nan")
    m = mean(values)
    return m, math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1) / len(values))


def smooth(values: Sequence[float], window: int) -> list[float]:
    """Centred moving average over `window` values (fewer at the ends), skipping NaNs."""
    half = window // 2
    out = []
    for i in range(len(values)):
        near = [v for v in values[max(0, i - half) : i + half + 1] if not math.isnan(v)]
        out.append(mean(near))
    return out


@dataclass(frozen=True)
class QuarterChange:
    """Mean of the first and of the last quarter of a series, their difference and its standard error."""

    first: float
    last: float
    first_se: float
    last_se: float
    per_quarter: int  # values in each quarter
    steps: int  # values in the series

    @property
    def change(self) -> float:
        return self.last - self.first

    @property
    def se(self) -> float:
        return math.sqrt(self.first_se**2 + self.last_se**2)

    @property
    def verdict(self) -> str:
        if math.isnan(self.se):
            return "too few steps to tell"
        if self.change > 2 * self.se:
            return "improved"
        if self.change < -2 * self.se:
            return "declined"
        return "no clear change"


def quarter_change(values: Sequence[float]) -> QuarterChange:
    """The first quarter of `values` against the last quarter (a quarter: `len(values) // 4` values, at least 1)."""
    values = [float(v) for v in values]
    quarter = max(1, len(values) // 4)
    first, first_se = mean_and_se(values[:quarter])
    last, last_se = mean_and_se(values[-quarter:])
    if len(values) < MIN_STEPS:
        first_se = last_se = float("nan")
    return QuarterChange(first, last, first_se, last_se, quarter, len(values))


TURN_REWARD = re.compile(r"^turn_(\d+)/reward_mean$")
AGENT_LENGTH = re.compile(r"^agent_(\d+)/completions/mean_length$")
AGENT_TOOL_CALLS = re.compile(r"^turn_1/agent_(\d+)/tools/call_frequency$")  # agents that act: calls per completion


def series(log_history: list[dict], pattern: re.Pattern) -> dict[int, tuple[list[float], list[float]]]:
    """For each index matched by `pattern` (turn or agent), the (steps, values) of the entries that log it."""
    found: dict[int, tuple[list[float], list[float]]] = {}
    for position, entry in enumerate(log_history):
        for key, value in entry.items():
            match = pattern.match(key)
            if match is None or not isinstance(value, (int, float)):
                continue
            steps, values = found.setdefault(int(match.group(1)), ([], []))
            steps.append(entry.get("step", position))
            values.append(float(value))
    return dict(sorted(found.items()))


def summary_lines(log_history: list[dict]) -> list[str]:
    """The end-of-run summary: per turn, the first-quarter and last-quarter mean reward with standard errors and
    whether it improved; per agent, the mean completion length in the same quarters."""
    turns = {turn: values for turn, (_, values) in series(log_history, TURN_REWARD).items()}
    if not turns:
        return ["Summary: no turn_{t}/reward_mean was logged (set logging_steps)."]
    steps = len(next(iter(turns.values())))
    quarter = max(1, steps // 4)
    lines = [
        f"Summary over {_count(steps, 'logged step')}: mean of the first {quarter} -> the last {quarter} "
        "(± standard error over steps); 'improved' = the change is more than twice its standard error."
    ]
    for turn, values in turns.items():
        c = quarter_change(values)
        if math.isnan(c.se):
            lines.append(
                f"  turn {turn} reward  {c.first:.3f} -> {c.last:.3f}: {c.verdict} "
                f"({_count(c.steps, 'step')}; needs {MIN_STEPS})"
            )
        else:
            lines.append(
                f"  turn {turn} reward  {c.first:.3f} ± {c.first_se:.3f} -> {c.last:.3f} ± {c.last_se:.3f}"
                f", change {c.change:+.3f} ± {c.se:.3f}: {c.verdict}"
            )
    for agent, (_, values) in series(log_history, AGENT_LENGTH).items():
        c = quarter_change(values)
        lines.append(f"  agent {agent} mean completion length  {c.first:.1f} -> {c.last:.1f} tokens")
    return lines


def _count(number: int, noun: str) -> str:
    """'1 step', '8 steps'."""
    return f"{number} {noun}{'' if number == 1 else 's'}"
