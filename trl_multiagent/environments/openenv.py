"""OpenEnv without HTTP: a server-side OpenEnv ``Environment`` in this process is the world itself.

TRL's OpenEnv pattern wraps a client: the world is a WebSocket session on a server, which `copy.deepcopy` cannot copy,
so a team's branches are forked by replay (a reset and every earlier call again, on the server) or by a ``_fork``
hook. An OpenEnv environment's own class (what its server runs: ``reset(seed, episode_id, **kwargs)``,
``step(action)``, ``state``) can instead be held in this process. Its game state is then plain Python objects (an
OpenSpiel ``pyspiel.State`` included), so ``copy.deepcopy`` forks it: a branch gets the real game state its parent
joint action left, at the cost of one copy, with no server, no session limit and nothing to replay.

`OpenEnvWorld` is that adapter. A subclass names the environment class and writes its tools as TRL asks (public
methods with type hints and a Google-style docstring), each playing an action through `_step`:

>>> class Counter:  # stands for an OpenEnv Environment: reset / step returning observations with reward and done
...     def reset(self, seed=None, episode_id=None, **kwargs):
...         self.total = 0
...         return {"total": 0, "reward": 0.0, "done": False}
...     def step(self, action):
...         self.total += action
...         return {"total": self.total, "reward": float(action), "done": self.total >= 3}
>>> class CounterWorld(OpenEnvWorld):
...     environment = Counter
...     def add(self, amount: int) -> str:
...         '''Add to the counter.
...
...         Args:
...             amount: how much to add.
...         '''
...         return f"total {self._step(amount)['total']}"
>>> world = CounterWorld()
>>> world.reset(seed=0), world.add(1)
(None, 'total 1')
>>> import copy
>>> branch = copy.deepcopy(world)  # how the trainer forks it for a later turn
>>> branch.add(2), world.add(1), branch.get_reward(), world.get_reward(), branch.done
('total 3', 'total 2', 3.0, 2.0, True)
>>> branch.add(1)
Traceback (most recent call last):
...
ValueError: The episode of CounterWorld is over (done); no more actions.

Nothing here imports OpenEnv: any class with its ``reset``/``step`` shape works, and observations may be OpenEnv's
pydantic models (attributes) or dicts (keys).
"""

from __future__ import annotations


class OpenEnvWorld:
    """An `environment_factory` class whose world is an OpenEnv server-side environment in this process.

    Class attributes:
        environment: the OpenEnv ``Environment`` class, instantiated once per world (a class, not a function: a
            function here would be a method, and so a tool).

    Hooks a subclass may override (private, so that they are not tools):
        `_reset_arguments(row)`: the keyword arguments of ``environment.reset`` for a dataset row (by default the
            row's ``seed`` column, when it has one).
        `_observe(observation)`: the text `reset` returns (added to each agent's first prompt, TRL's rule), or None;
            or one text per agent (a tuple: hidden information, each agent told only what it sees). Without a seed in
            the row the environment may draw its own start: each joint action is then prompted with its own world's
            observation (`worlds.Worlds.start`), and a later turn's fork copies the drawn state.

    State, for rewards and transitions: `observation` (the last one), `reward` (the sum of the rewards of the
    episode's steps, what `get_reward` returns: TRL's reward column named after the class), `done`, `steps`.
    """

    environment: type | None = None

    def __init__(self):
        if self.environment is None:
            raise TypeError(
                f"{type(self).__name__}: set the class attribute `environment` to the OpenEnv environment class "
                "(server side) that this world runs in-process."
            )
        self.env = self.environment()
        self.observation, self.reward, self.done, self.steps = None, 0.0, False, 0

    def reset(self, **row) -> str | None:
        """TRL's `reset(**row)`: a new episode of the environment; the observation as text (`_observe`), or None."""
        self.observation = self.env.reset(**self._reset_arguments(row))
        self.reward, self.done, self.steps = 0.0, bool(_field(self.observation, "done", False)), 0
        return self._observe(self.observation)

    def _reset_arguments(self, row: dict) -> dict:
        return {"seed": row["seed"]} if "seed" in row else {}

    def _observe(self, observation) -> str | None:
        return None

    def _step(self, action):
        """Play `action` (the environment's Action) and return the observation; its reward adds to `reward`. After
        the episode ends, a ValueError, which the agent reads as its call's error (TRL's convention)."""
        if self.done:
            raise ValueError(f"The episode of {type(self).__name__} is over (done); no more actions.")
        self.observation = self.env.step(action)
        self.steps += 1
        self.reward += float(_field(self.observation, "reward", 0.0) or 0.0)
        self.done = bool(_field(self.observation, "done", False))
        return self.observation

    def get_reward(self) -> float:
        """The episode's reward so far: the sum of its steps' rewards."""
        return self.reward

    def close(self) -> None:
        """Close the environment, if it can be (the trainer calls this once per instance)."""
        close = getattr(self.env, "close", None)
        if callable(close):
            close()


def _field(observation, name: str, default):
    """An OpenEnv observation's field: a pydantic model's attribute, or a dict's key."""
    if isinstance(observation, dict):
        return observation.get(name, default)
    return getattr(observation, name, default)
