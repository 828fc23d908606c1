"""How a branch of the rollout tree gets its own world after turn 1, and what a world's state came from.

Joint action k of a node in turn t > 1 acts on its own fork of the world its parent joint action left. Three ways to
fork, tried in this order for each environment class (`environments.worlds.Worlds.fork` says once, at WARNING, which one a
class uses):

1. ``copy.deepcopy(world)`` (which calls the class's ``__deepcopy__(self, memo)`` when it defines one): costs one copy
   of the world's state.
2. The environment's own hook ``_fork(self)``, returning a new instance in the same state (re-opening a connection,
   say). A leading underscore keeps it from being a tool, in TRL as here. Costs what the hook does.
3. **Replay**: a pooled instance is reset with the row and the branch's tool calls so far are run again on it, in
   order (`replay`). Costs a reset and every earlier call of the branch, per fork. It assumes a deterministic
   environment: each replayed result is compared with the recorded one, and a difference is an error naming the
   class, the turn, the agent and the call.

Every world carries a `Journal`: the row it was reset with and the tool rounds run on it since, so that any world can
be replayed whatever the fork method of its ancestors.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from ..callables import short_repr


FORK_HOOK = "_fork"


@dataclass
class Round:
    """One completion's calls of its world's tools in one round of TRL's tool loop, and what each returned."""

    turn: int
    agent: int
    calls: list[dict]  # as `parse_response` gives them: {"type": "function", "function": {"name", "arguments"}}
    contents: list  # the content of each call's tool message: the result as the agent saw it, or {"error": ...}


@dataclass
class Journal:
    """What made a world's state: the environment (its routing key), the row it was reset with, the global random
    state its reset drew from, its reset's observation, and the tool rounds run on it since (oldest first)."""

    name: Any
    columns: dict
    random_state: tuple
    observation: Any
    turn: int = 1  # the turn in which this world is acted on
    rounds: list[Round] = field(default_factory=list)

    def branch(self, turn: int) -> Journal:
        """The journal of a fork acted on in `turn`: the same history, its own list to grow."""
        return replace(self, turn=turn, rounds=list(self.rounds))


def random_state() -> tuple:
    """The global random state an environment's `reset` may draw from: Python's `random`, and NumPy's once imported."""
    numpy = sys.modules.get("numpy")
    return random.getstate(), numpy.random.get_state() if numpy is not None else None


def set_random_state(state: tuple) -> None:
    python_state, numpy_state = state
    random.setstate(python_state)
    if numpy_state is not None:
        sys.modules["numpy"].random.set_state(numpy_state)


def replay(
    world: Any,
    journal: Journal,
    reset: Callable[[Any, Journal], Any],
    tools: Callable[[Any, int], dict[str, Callable]],
    call_tools: Callable[[list[dict], dict[str, Callable]], tuple[list[dict], int]],
    turn: int,
) -> None:
    """Bring the fresh instance `world` to the state `journal` records: `reset(world, journal)` (returns the
    observation), then each round's calls through `call_tools`, with `tools(world, agent)`, in order. A result that
    differs from the recorded one raises `ReplayMismatch`."""
    cls = type(world).__name__
    observation = reset(world, journal)
    if observation != journal.observation:
        raise StartMismatch(
            f"MAGRPOTrainer: replaying the environment {cls} for a branch of turn {turn}: reset(**row) returned "
            f"{short_repr(observation)}, but {short_repr(journal.observation)} when the branch began (row "
            f"{short_repr(journal.columns)}). {_DETERMINISTIC.format(cls=cls)}"
        )
    for number, recorded in enumerate(journal.rounds, start=1):
        messages, _ = call_tools(recorded.calls, tools(world, recorded.agent))
        for call, content, message in zip(recorded.calls, recorded.contents, messages, strict=True):
            if message["content"] != content:
                function = call.get("function", {})
                raise ReplayMismatch(
                    f"MAGRPOTrainer: replaying the environment {cls} for a branch of turn {turn}: the call "
                    f"{function.get('name')}({short_repr(function.get('arguments'))}) that agent {recorded.agent} made in "
                    f"turn {recorded.turn} (round {number} of the branch's tool rounds) returned "
                    f"{short_repr(message['content'])} on replay, but {short_repr(content)} when it was made. "
                    f"{_DETERMINISTIC.format(cls=cls)}"
                )


class ReplayMismatch(RuntimeError):
    """A replayed environment did not reach the state it was in: it is not deterministic."""


class StartMismatch(ReplayMismatch):
    """A replayed environment's reset, with the row and the global random state of the first, returned another
    observation: it draws its own start."""


_DETERMINISTIC = (
    "{cls} cannot be copied (copy.deepcopy fails and it has no _fork), so each branch's world is rebuilt by "
    "resetting a pooled instance with the row and replaying the branch's tool calls in order, which needs a "
    "deterministic environment: the same row and calls give the same results. Make it deterministic (draw its "
    "randomness from the row, e.g. a seed column passed on to a server's reset, or from Python's or NumPy's global "
    "random state, which replay restores for reset), or "
    "define {cls}.__deepcopy__(self, memo) or {cls}._fork(self) to return a new instance in the same state."
)
