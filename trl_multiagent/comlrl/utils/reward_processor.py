"""CoMLRL's `comlrl.utils.reward_processor`: `RewardProcessors`, the trainers' `reward_processor=` builders."""

from __future__ import annotations

from collections.abc import Callable


class RewardProcessors:
    """CoMLRL 1.4.3's reward processors: functions of one reward value, for `MAGRPOTrainer(reward_processor=...)`."""

    @staticmethod
    def scale(factor: float = 1.0) -> Callable[[float], float]:
        """A processor that multiplies a reward by `factor`."""
        return lambda reward: reward * factor

    @staticmethod
    def shift(value: float = 0.0) -> Callable[[float], float]:
        """A processor that adds `value` to a reward."""
        return lambda reward: reward + value
