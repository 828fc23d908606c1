"""Where a step's time goes: the rollout's phases and the update, as the `timing/*` and `throughput/*` metrics.

Each phase is logged three ways, so that a slow phase shows whether it computed more or waited on something else:

- `timing/{phase}_s`: wall-clock seconds;
- `timing/{phase}_cpu_s`: CPU seconds of this process, every thread counted (colocated vLLM engines run in it, so an
  engine busy in the background shows here);
- `timing/{phase}_other_cpu_s`: CPU seconds the rest of the machine used meanwhile (other processes: a vLLM engine
  core in its own process, data workers, another job), from `/proc/stat`; absent where that file is missing;
- `timing/{phase}_page_faults`: the page faults this process took (each first touch of memory the allocator got
  fresh from the kernel costs one per 4 KiB page, in kernel time counted in the CPU seconds).

>>> times = RolloutTimes()
>>> with times.phase("generate"):
...     pass
>>> times.generated_tokens += 50
>>> sorted(key for key in times.metrics(PhaseTimes(("reward",))) if not key.endswith(("cpu_s", "page_faults")))
['throughput/generate_tokens_per_s', 'timing/generate_s', 'timing/logps_s', 'timing/reward_s', 'timing/sync_s']
"""

from __future__ import annotations

import contextlib
import math
import os
import resource
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

    >>> span = Reading(10.0, 4.0, 9.0, 700) - Reading(8.0, 3.0, 5.0, 200)
    >>> span.wall, span.cpu, span.other_cpu, span.page_faults
    (2.0, 1.0, 3.0, 500)
    """

    wall: float
    cpu: float
    machine_cpu: float
    page_faults: int = 0

    @classmethod
    def now(cls) -> Reading:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return cls(time.perf_counter(), time.process_time(), machine_cpu_seconds(), usage.ru_minflt + usage.ru_majflt)

    def __sub__(self, other: Reading) -> Reading:
        return Reading(*(a - b for a, b in zip(self._values(), other._values(), strict=True)))

    def __add__(self, other: Reading) -> Reading:
        return Reading(*(a + b for a, b in zip(self._values(), other._values(), strict=True)))

    def _values(self) -> tuple:
        return self.wall, self.cpu, self.machine_cpu, self.page_faults

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
            metrics[f"timing/{phase}_page_faults"] = spent.page_faults
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


class MicroStep:
    """One training micro-step, as `training_step` measures it: the update's cost is the step's, from `MicroStep()` to
    `update()`, less the rollout that `_prepare_inputs` may have run in it (`prepared`, with the tokens of the rows).

    >>> step = MicroStep()
    >>> step.prepared(Reading(1.0, 0.0, 0.0), tokens=12)
    >>> step.update().wall < 0, step.tokens  # the step took less than the second its rollout is said to have taken
    (True, 12)
    """

    def __init__(self):
        self.start, self.rollout, self.tokens = Reading.now(), ZERO, 0

    def prepared(self, rollout: Reading, tokens: int) -> None:
        self.rollout, self.tokens = rollout, tokens

    def update(self) -> Reading:
        return Reading.now() - self.start - self.rollout


class UpdateTimes:
    """The update's time and tokens over one optimizer step's micro-batches (forward and backward, without the
    rollout that a micro-step may have run first).

    >>> times = UpdateTimes()
    >>> times.add(Reading(2.0, 3.5, 4.0, 10), tokens=100); times.add(Reading(2.0, 4.0, 4.0, 20), tokens=300)
    >>> times.flush()  # doctest: +NORMALIZE_WHITESPACE
    {'timing/update_s': 4.0, 'timing/update_cpu_s': 7.5, 'timing/update_other_cpu_s': 0.5, 'timing/update_page_faults': 30,
     'throughput/update_tokens_per_s': 100.0}
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
        metrics["timing/update_page_faults"] = self.spent.page_faults
        metrics["throughput/update_tokens_per_s"] = self.tokens / max(self.spent.wall, 1e-9)
        self.spent, self.tokens = ZERO, 0
        return metrics
