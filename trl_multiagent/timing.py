"""Where a step's time goes: the rollout's phases and the update, as the `timing/*` and `throughput/*` metrics.

Each phase is logged three ways, so that a slow phase shows whether it computed more or waited on something else:

- `timing/{phase}_s`: wall-clock seconds;
- `timing/{phase}_cpu_s`: CPU seconds of this process, every thread counted (colocated vLLM engines run in it, so an
  engine busy in the background shows here);
- `timing/{phase}_other_cpu_s`: CPU seconds the rest of the machine used meanwhile (other processes: a vLLM engine
  core in its own process, data workers, another job), from `/proc/stat`; absent where that file is missing.

>>> times = RolloutTimes()
>>> with times.phase("generate"):
...     pass
>>> times.generated_tokens += 50
>>> sorted(key for key in times.metrics(PhaseTimes(("reward",))) if not key.endswith("cpu_s"))
['throughput/generate_tokens_per_s', 'timing/generate_s', 'timing/logps_s', 'timing/reward_s', 'timing/sync_s']
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from dataclasses import dataclass


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def machine_cpu_seconds() -> float:
    """Busy CPU seconds of the whole machine since boot (every core; idle and iowait excluded), NaN without
    `/proc/stat`."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(x) for x in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return math.nan
    user, nice, system, idle, iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return (user + nice + system + irq + softirq + steal) / _CLOCK_TICKS


@dataclass(frozen=True)
class Reading:
    """Wall-clock, this process's CPU and the machine's busy CPU seconds; a difference of two is a span's cost.

    >>> span = Reading(10.0, 4.0, 9.0) - Reading(8.0, 3.0, 5.0)
    >>> span.wall, span.cpu, span.other_cpu
    (2.0, 1.0, 3.0)
    """

    wall: float
    cpu: float
    machine_cpu: float

    @classmethod
    def now(cls) -> Reading:
        return cls(time.perf_counter(), time.process_time(), machine_cpu_seconds())

    def __sub__(self, other: Reading) -> Reading:
        return Reading(self.wall - other.wall, self.cpu - other.cpu, self.machine_cpu - other.machine_cpu)

    def __add__(self, other: Reading) -> Reading:
        return Reading(self.wall + other.wall, self.cpu + other.cpu, self.machine_cpu + other.machine_cpu)

    @property
    def other_cpu(self) -> float:
        """CPU seconds of every other process over the span (`/proc/stat` counts in 10 ms ticks: never below 0)."""
        return max(self.machine_cpu - self.cpu, 0.0)


ZERO = Reading(0.0, 0.0, 0.0)


class PhaseTimes:
    """Wall-clock and CPU seconds spent in each named phase, summed over its spans."""

    def __init__(self, names: tuple[str, ...]):
        self.spent = dict.fromkeys(names, ZERO)

    @contextlib.contextmanager
    def phase(self, name: str):
        start = Reading.now()
        try:
            yield
        finally:
            self.spent[name] = self.spent[name] + (Reading.now() - start)

    def metrics(self) -> dict[str, float]:
        metrics = {}
        for phase, spent in self.spent.items():
            metrics[f"timing/{phase}_s"] = spent.wall
            metrics[f"timing/{phase}_cpu_s"] = spent.cpu
            if not math.isnan(spent.machine_cpu):
                metrics[f"timing/{phase}_other_cpu_s"] = spent.other_cpu
        return metrics


class RolloutTimes(PhaseTimes):
    """One rollout's phases (`sync` of the engines' weights, `generate`, `logps` passes) and the tokens generated;
    `metrics` adds the environment's own phases (reward, transition)."""

    def __init__(self):
        super().__init__(("sync", "generate", "logps"))
        self.generated_tokens = 0

    def metrics(self, environment: PhaseTimes) -> dict[str, float]:
        metrics = {**super().metrics(), **environment.metrics()}
        if self.spent["generate"].wall > 0:
            metrics["throughput/generate_tokens_per_s"] = self.generated_tokens / self.spent["generate"].wall
        return metrics


class UpdateTimes:
    """The update's time and tokens over one optimizer step's micro-batches (forward and backward, without the
    rollout that a micro-step may have run first).

    >>> times = UpdateTimes()
    >>> times.add(Reading(2.0, 3.5, 4.0), tokens=100); times.add(Reading(2.0, 4.0, 4.0), tokens=300)
    >>> times.flush()
    {'timing/update_s': 4.0, 'timing/update_cpu_s': 7.5, 'timing/update_other_cpu_s': 0.5, 'throughput/update_tokens_per_s': 100.0}
    >>> times.spent == ZERO, times.tokens
    (True, 0)
    """

    def __init__(self):
        self.spent, self.tokens = ZERO, 0

    def add(self, spent: Reading, tokens: int) -> None:
        self.spent += spent
        self.tokens += tokens

    def flush(self) -> dict[str, float]:
        """The step's metrics; the counts start again."""
        metrics = {"timing/update_s": self.spent.wall, "timing/update_cpu_s": self.spent.cpu}
        if not math.isnan(self.spent.machine_cpu):
            metrics["timing/update_other_cpu_s"] = self.spent.other_cpu
        metrics["throughput/update_tokens_per_s"] = self.tokens / max(self.spent.wall, 1e-9)
        self.spent, self.tokens = ZERO, 0
        return metrics
