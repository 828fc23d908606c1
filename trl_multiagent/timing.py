"""Where a step's time goes: the rollout's phases and the update, as the `timing/*` and `throughput/*` metrics.

>>> times = RolloutTimes()
>>> with times.phase("generate"):
...     pass
>>> times.generated_tokens += 50
>>> sorted(times.metrics({"reward": 0.2}))
['throughput/generate_tokens_per_s', 'timing/generate_s', 'timing/logps_s', 'timing/reward_s', 'timing/sync_s']
"""

from __future__ import annotations

import contextlib
import time


class RolloutTimes:
    """Seconds per phase of one rollout (`sync` of the engines' weights, `generate`, `logps` passes), and the tokens
    generated; `metrics` adds the environment's own phases (reward, transition)."""

    def __init__(self):
        self.seconds = dict.fromkeys(("sync", "generate", "logps"), 0.0)
        self.generated_tokens = 0

    @contextlib.contextmanager
    def phase(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - start

    def metrics(self, other_seconds: dict[str, float]) -> dict[str, float]:
        metrics = {f"timing/{phase}_s": seconds for phase, seconds in {**self.seconds, **other_seconds}.items()}
        if self.seconds["generate"] > 0:
            metrics["throughput/generate_tokens_per_s"] = self.generated_tokens / self.seconds["generate"]
        return metrics


class UpdateTimes:
    """The update's seconds and tokens over one optimizer step's micro-batches (forward and backward, without the
    rollout that a micro-step may have run first).

    >>> times = UpdateTimes()
    >>> times.add(seconds=2.0, tokens=100); times.add(seconds=2.0, tokens=300)
    >>> times.flush()
    {'timing/update_s': 4.0, 'throughput/update_tokens_per_s': 100.0}
    >>> times.seconds, times.tokens
    (0.0, 0)
    """

    def __init__(self):
        self.seconds, self.tokens = 0.0, 0

    def add(self, seconds: float, tokens: int) -> None:
        self.seconds += seconds
        self.tokens += tokens

    def flush(self) -> dict[str, float]:
        """The step's metrics; the counts start again."""
        metrics = {
            "timing/update_s": self.seconds,
            "throughput/update_tokens_per_s": self.tokens / max(self.seconds, 1e-9),
        }
        self.seconds, self.tokens = 0.0, 0
        return metrics
