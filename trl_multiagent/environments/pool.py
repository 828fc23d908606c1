"""The instances of each environment: constructed once and reset often, as TRL 1.16 pools them, and closed once.

A rollout takes instances from the pool (`take`), one per world it needs; the pool grows only when a rollout needs
more instances of an environment than it has made so far. When the next rollout starts (`release`) every pooled
instance may be taken, and reset, again. Worlds made by copying a pooled one (`copy.deepcopy`, the environment's
`_fork`) are not pooled: they live for their rollout and are closed by `release`. `close` closes every instance at
the end of training, or on an error.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from transformers.utils import logging


logger = logging.get_logger(__name__)


class WorldPool:
    """Per routing key (None for a single factory), the instances made by its factory.

    Args:
        factories: TRL's `environment_factory` as a dict, ``{name: factory}``.
    """

    def __init__(self, factories: dict[Any, Callable]):
        self.factories = factories
        self.instances: dict[Any, list] = {name: [] for name in factories}
        self.taken = dict.fromkeys(factories, 0)  # per name, how many instances this rollout has taken
        self.copies: list = []  # this rollout's worlds made by copying: closed when it is released

    def seed(self, name, instance) -> None:
        """Pool an instance made elsewhere (the probe that read the environment's tools, as TRL seeds its pool)."""
        self.instances[name].append(instance)

    def take(self, name) -> Any:
        """An instance of environment `name` that this rollout has not taken yet, made when every one is taken."""
        pool = self.instances[name]
        if self.taken[name] == len(pool):
            pool.append(self.factories[name]())
        self.taken[name] += 1
        return pool[self.taken[name] - 1]

    def adopt(self, world) -> None:
        """A copy made for this rollout, to close with it."""
        self.copies.append(world)

    def release(self) -> None:
        """The next rollout starts: every pooled instance may be taken again, and the last rollout's copies close."""
        copies, self.copies = self.copies, []
        self.taken = dict.fromkeys(self.factories, 0)
        close_each(copies)

    def close(self) -> None:
        """Close every instance, pooled or copied, once. The pool is then empty: a later rollout makes new ones."""
        everything = [world for pool in self.instances.values() for world in pool] + self.copies
        for pool in self.instances.values():  # emptied in place: the trainer's `_environment_pool` is this dict
            pool.clear()
        self.copies = []
        self.taken = dict.fromkeys(self.factories, 0)
        close_each(everything)


def close_each(worlds: list) -> None:
    """`close()` on each world that defines it, once each. A `close` that raises is logged at ERROR with its class and
    the others are still closed: this runs when training ends, where an exception would hide the one that ended it."""
    seen = set()
    for world in worlds:
        close = getattr(world, "close", None)
        if id(world) in seen or not callable(close):
            continue
        seen.add(id(world))
        try:
            close()
        except Exception as err:
            logger.error(f"MAGRPOTrainer: {type(world).__name__}.close() raised {type(err).__name__}: {err}")
