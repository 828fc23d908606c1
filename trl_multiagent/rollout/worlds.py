"""TRL's `environment_factory` for a team: one world per joint trajectory, shared by the agents, copied at each branch.

TRL's contract, kept: the factory (a class or callable, or a dict of them routed by the row's ``environment``
column) returns an object with ``reset(**row) -> str | None``; a returned string is added to the last user message of
every agent's first prompt; every other public method except ``get_reward`` is a tool (type hints and a Google-style
docstring, as for `tools=`); an optional ``get_reward()`` becomes a reward column named after the class, and reward
functions receive ``environments=``.

What a team adds:

* **One world per rollout root, shared by the team.** It is made and reset once per dataset row of a rollout.
* **Each branch continues on its own copy.** Joint action k of a node acts on ``copy.deepcopy`` of the node's world;
  the node it expands into starts from that copy. A world that holds what cannot be copied (a process, a socket)
  defines ``__deepcopy__(self, memo)``, Python's own hook, returning a new world with the same state: TRL would expose a
  public ``fork`` method as a tool, a dunder it never sees.
* **Per-agent tools.** A class attribute ``agent_tools``, one list of method names per agent (or a dict from agent
  index to names; agents left out get every tool), gives agent i only those methods. TRL ignores the attribute, so the
  same class still runs under GRPOTrainer.
* **Per-agent rewards.** A class attribute ``per_agent_reward = True`` states that ``get_reward()`` returns one value
  per agent, agent i's own reward (read as `rewards.each_agent` states): the reward column is their aggregate
  (`MAGRPOConfig.agent_reward_aggregation`), and `MAGRPOConfig.team_reward_weight` below 1 mixes each agent's own value
  into what it learns from. Without it, ``get_reward()`` returns one number for the team, as in TRL.

>>> class Notebook:
...     agent_tools = [["write"], ["read"]]
...     def reset(self, **row):
...         self.notes = []
...     def write(self, note: str) -> str:
...         '''Write a note in the shared notebook.
...
...         Args:
...             note: the text to write.
...         '''
...         self.notes.append(note)
...         return "ok"
...     def read(self) -> str:
...         '''Read the shared notebook.'''
...         return " | ".join(self.notes)
>>> worlds = Worlds(Notebook, num_agents=2)
>>> world, prompts = worlds.start({"prompt": "hi"}, ["hi", "hi"])
>>> [tool.__name__ for tool in worlds.tools(world, 0)], [tool.__name__ for tool in worlds.tools(world, 1)]
(['write'], ['read'])
>>> branch = worlds.fork(world); _ = branch.write("x")
>>> world.notes, branch.notes
([], ['x'])
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable
from typing import Any


RESERVED_METHODS = ("reset", "get_reward")


def tool_method_names(cls: type) -> list[str]:
    """TRL's rule: every public function of the class but `reset` and `get_reward` is a tool (listed on the class, as
    TRL does, so that properties are not evaluated)."""
    return [
        name
        for name, _ in inspect.getmembers(cls, predicate=inspect.isfunction)
        if name not in RESERVED_METHODS and not name.startswith("_")
    ]


def _per_agent_names(cls: type, names: list[str], num_agents: int) -> list[list[str]]:
    """The method names each agent may call: `cls.agent_tools` (one list per agent, or {agent: names}), else all."""
    chosen = getattr(cls, "agent_tools", None)
    where = f"{cls.__name__}.agent_tools"
    if chosen is None:
        return [list(names) for _ in range(num_agents)]
    if isinstance(chosen, dict):
        unknown_agents = [a for a in chosen if not isinstance(a, int) or not 0 <= a < num_agents]
        if unknown_agents:
            raise ValueError(
                f"MAGRPOTrainer: {where} names agents {unknown_agents}; the team has 0..{num_agents - 1}."
            )
        chosen = [chosen.get(i, names) for i in range(num_agents)]
    if not isinstance(chosen, (list, tuple)) or len(chosen) != num_agents:
        raise ValueError(
            f"MAGRPOTrainer: {where} must be one list of method names per agent ({num_agents} lists), or a dict from "
            f"agent index to names; got {chosen!r}."
        )
    for agent, agent_names in enumerate(chosen):
        unknown = [n for n in agent_names if n not in names]
        if unknown or isinstance(agent_names, str):
            raise ValueError(
                f"MAGRPOTrainer: {where}[{agent}] = {agent_names!r} must list tool methods of {cls.__name__}; "
                f"{unknown or agent_names!r} are not among them ({names})."
            )
    return [list(agent_names) for agent_names in chosen]


class Worlds:
    """The team's environments: made and reset per rollout root (`start`), copied per joint action (`fork`), each
    agent's tools bound to one world (`tools`), and the `get_reward` columns (`reward_funcs`).

    Args:
        environment_factory: TRL's: a callable returning a world, or a dict of them routed by the row's
            ``environment`` column.
        num_agents: the team's size (for `agent_tools`).
    """

    def __init__(self, environment_factory, num_agents: int):
        self.routed = isinstance(environment_factory, dict)
        self.factories = environment_factory if self.routed else {None: environment_factory}
        self.num_agents = num_agents
        self.agent_names: dict[type, list[list[str]]] = {}  # per world class, each agent's tool method names
        self.reward_funcs: list[Callable] = []
        for name, factory in self.factories.items():
            where = "environment_factory" + ("" if name is None else f"[{name!r}]")
            if not callable(factory):
                raise TypeError(
                    f"MAGRPOTrainer: {where} must be a class or callable making an environment, got {factory!r}."
                )
            probe = factory()  # as TRL: one instance at start-up, to read its tools
            cls = type(probe)
            if not callable(getattr(probe, "reset", None)):
                raise ValueError(
                    f"MAGRPOTrainer: the environment {cls.__name__} (from {where}) must define a callable "
                    "`reset(**row)`, as TRL asks."
                )
            if cls not in self.agent_names:
                self.agent_names[cls] = _per_agent_names(cls, tool_method_names(cls), num_agents)
                if callable(getattr(probe, "get_reward", None)):
                    self.reward_funcs.append(_reward_column(cls))

    def factory(self, row: dict) -> Callable:
        if not self.routed:
            return self.factories[None]
        name = row.get("environment")
        if name not in self.factories:
            raise ValueError(
                f"MAGRPOTrainer: a dataset row has environment={name!r}, which is not among the environments passed "
                f"to `environment_factory`: {list(self.factories)}. Each row's 'environment' column names one."
            )
        return self.factories[name]

    def start(self, row: dict, prompts: list) -> tuple[Any, list]:
        """A new world for `row`, reset with the row's columns (less the routing column), and the first prompts with
        the reset's observation added to each agent's last user message."""
        world = self.factory(row)()
        columns = {k: v for k, v in row.items() if k != "environment"} if self.routed else row
        observation = world.reset(**columns)
        if observation is None:
            return world, prompts
        return world, [with_observation(prompt, observation) for prompt in prompts]

    def fork(self, world: Any) -> Any:
        """The world's copy for one joint action: `copy.deepcopy` (which calls the world's `__deepcopy__` if any)."""
        name = type(world).__name__
        try:
            copied = copy.deepcopy(world)
        except Exception as err:
            raise TypeError(
                f"MAGRPOTrainer: the environment {name} cannot be copied for a branch of the rollout tree "
                f"(copy.deepcopy raised {type(err).__name__}: {err}). Each joint action acts on its own copy of its "
                f"node's world. Define `{name}.__deepcopy__(self, memo)` to return a new {name} with the same state "
                "(re-open a process or a connection there), or keep such resources outside the environment."
            ) from err
        if copied is world:
            raise TypeError(
                f"MAGRPOTrainer: copy.deepcopy of the environment {name} returned the same object, so sibling branches "
                f"would share one world. `{name}.__deepcopy__` must return a new instance."
            )
        return copied

    def tools(self, world: Any, agent: int) -> list[Callable]:
        """Agent `agent`'s tools: the world's methods it may call, bound to this world."""
        return [getattr(world, name) for name in self.agent_names[type(world)][agent]]

    def check(self, row: dict, prompts: list) -> Any:
        """Before any generation: start one world on `row` and fork it once (a world that cannot be copied fails
        here, not after the first generation). Returns the world."""
        world, _ = self.start(row, prompts)
        self.fork(world)
        return world


def with_observation(prompt, observation):
    """TRL's rule for `reset`'s result: added to the content of the last message (a chat prompt), or to the text."""
    if isinstance(prompt, str):
        return prompt + observation if isinstance(observation, str) else prompt
    last = prompt[-1]
    content = last["content"]
    if isinstance(observation, list) and isinstance(content, str):
        content = [{"type": "text", "text": content}]
    if isinstance(observation, str) and isinstance(content, list):
        observation = [{"type": "text", "text": observation}]
    return [*prompt[:-1], {**last, "content": content + observation}]


def _reward_column(cls: type) -> Callable:
    """The world's `get_reward()` as a joint reward function named after its class (TRL's column): one value per joint
    action (one list per joint action, a value per agent, with ``per_agent_reward = True``, which the function keeps as
    its attribute), None for a joint action whose world is of another class."""
    per_agent = getattr(cls, "per_agent_reward", False)
    if not isinstance(per_agent, bool):
        raise TypeError(f"MAGRPOTrainer: {cls.__name__}.per_agent_reward must be True or False, got {per_agent!r}.")

    def checked(value):
        if not per_agent and isinstance(value, (list, tuple)):
            raise ValueError(
                f"MAGRPOTrainer: {cls.__name__}.get_reward() returned {value!r}, a list. If it gives each agent its own "
                f"reward, set the class attribute `per_agent_reward = True` on {cls.__name__}; otherwise return one "
                "number for the team, as TRL asks."
            )
        return value

    if inspect.iscoroutinefunction(cls.get_reward):

        async def reward(*completions, environments, **kwargs):
            return [checked(await e.get_reward()) if type(e) is cls else None for e in environments]

    else:

        def reward(*completions, environments, **kwargs):
            return [checked(e.get_reward()) if type(e) is cls else None for e in environments]

    reward.__name__ = reward.__qualname__ = cls.__name__
    reward.per_agent_reward = per_agent  # read where the columns join the rewards (`arguments.joint_reward`)
    return reward
