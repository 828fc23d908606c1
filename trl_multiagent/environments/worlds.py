"""TRL's `environment_factory` for a team: one world per joint action, shared by its agents, forked at each branch.

TRL's contract, kept: the factory (a class or callable, or a dict of them routed by the row's ``environment``
column) returns an object with ``reset(**row) -> str | None``; a returned string is added to the last user message of
every agent's first prompt; every other public method except ``get_reward`` is a tool (type hints and a Google-style
docstring, as for `tools=`); an optional ``get_reward()`` becomes a reward column named after the class, and reward
functions receive ``environments=``.

What a team adds:

* **One world per joint action, shared by its agents.** In turn 1 each joint action of a row acts on its own pooled
  instance (`environments.pool`: constructed once, reset often, as TRL 1.16 pools them), reset with the row; a joint
  action's agents act on it in turn. From turn 2, joint action k of a node acts on its own fork of the world its parent
  joint action left (`environments.forks`: ``copy.deepcopy``, else the class's ``_fork()``, else replay of the branch's tool
  calls on a reset instance).
* **Each joint action's observation.** ``reset`` may return one observation for every agent (TRL's), or one per agent
  (a tuple, or a list of strings: hidden information, agent i's added to agent i's prompt only). When the K resets of
  a row return the same observations the joint actions share one prompt per agent (K samples of it); when they differ
  (an environment that draws its own start, as TRL's OpenEnv games do) each joint action's prompts hold its own
  world's observations, as GRPOTrainer gives each completion its own, and the K completions stay one group.
* **Closed once.** Every instance made (pooled, copied or forked) that defines ``close()`` is closed once: copies when
  the next rollout starts, the pool at the end of training or on an error.
* **Per-agent tools.** A class attribute ``agent_tools``, one list of method names per agent (or a dict from agent
  index to names; agents left out get every tool), gives agent i only those methods. TRL ignores the attribute, so the
  same class still runs under GRPOTrainer.
* **Per-agent rewards.** A class attribute ``per_agent_reward = True`` states that ``get_reward()`` returns one value
  per agent, agent i's own reward (read as `rewards.wrappers.each_agent` states): the reward column is their aggregate
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
>>> (first, second), prompts, _ = worlds.start({"prompt": "hi"}, ["hi", "hi"], count=2)  # two joint actions, turn 1
>>> [tool.__name__ for tool in worlds.tools(first, 0)], [tool.__name__ for tool in worlds.tools(first, 1)]
(['write'], ['read'])
>>> _ = first.write("x")
>>> branch = worlds.fork(first, turn=2); _ = branch.write("y")
>>> first.notes, second.notes, branch.notes
(['x'], [], ['x', 'y'])
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import functools
import inspect
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Any

from transformers.utils import logging

from ..callables import short_repr
from .calls import call_tools
from .faults import EnvironmentLost, is_lost
from .forks import FORK_HOOK, Journal, Round, StartMismatch, random_state, replay, set_random_state
from .pool import WorldPool


logger = logging.get_logger(__name__)


# TRL reserves `reset` and `get_reward`. `close` is reserved too: the trainer calls it once when training ends, so an
# agent must not be able to call it mid-rollout (TRL, which never closes an environment, would make it a tool).
RESERVED_METHODS = ("reset", "get_reward", "close")


def tool_method_names(cls: type) -> list[str]:
    """TRL's rule: every public function of the class but `reset`, `get_reward` (and `close`, here) is a tool (listed
    on the class, as TRL does, so that properties are not evaluated)."""
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
    """The team's environments: pooled instances reset per joint action of turn 1 (`start`), a fork per joint action
    of later turns (`fork`), each agent's tools bound to one world (`tools`) and the calls made on it (`record`), the
    `get_reward` columns (`reward_funcs`), and `close`.

    Args:
        environment_factory: TRL's: a callable returning a world, or a dict of them routed by the row's
            ``environment`` column.
        num_agents: the team's size (for `agent_tools`).
        tool_call_timeout: seconds one tool call may run (None: no limit); replay runs the recorded calls with it, as
            they first ran.
    """

    def __init__(self, environment_factory, num_agents: int, tool_call_timeout: float | None = None):
        self.routed = isinstance(environment_factory, dict)
        factories = environment_factory if self.routed else {None: environment_factory}
        self.num_agents = num_agents
        self.call_tools = partial(call_tools, timeout=tool_call_timeout)
        self.agent_names: dict[type, list[list[str]]] = {}  # per world class, each agent's tool method names
        self.reward_funcs: list[Callable] = []
        self.fork_methods: dict[type, str] = {}  # per world class: "copy", "hook" or "replay", once known
        self.journals: dict[int, tuple[Any, Journal]] = {}  # id(world) -> (world, journal), for this rollout's worlds
        # the classes whose resets of one row returned different observations: they draw their own start, which
        # replay cannot repeat
        self.own_starts: set[type] = set()
        self.pool = WorldPool(factories)
        made_here = _made_here.get()
        if made_here is not None:
            made_here.append(self)
        try:
            for name, factory in factories.items():
                self._probe(name, factory)
        except BaseException:  # a refused environment: the probes made so far close
            self.close()
            raise

    def _probe(self, name, factory) -> None:
        """As TRL: one instance at start-up, to check `reset` and read its tools; it seeds the pool."""
        where = "environment_factory" + ("" if name is None else f"[{name!r}]")
        if not callable(factory):
            raise TypeError(
                f"MAGRPOTrainer: {where} must be a class or callable making an environment, got {factory!r}."
            )
        probe = factory()
        self.pool.seed(name, probe)
        cls = type(probe)
        if not callable(getattr(probe, "reset", None)):
            raise ValueError(
                f"MAGRPOTrainer: the environment {cls.__name__} (from {where}) must define a callable "
                "`reset(**row)`, as TRL asks."
            )
        if cls not in self.agent_names:
            self.agent_names[cls] = _per_agent_names(cls, tool_method_names(cls), self.num_agents)
            if callable(getattr(probe, "get_reward", None)):
                self.reward_funcs.append(_reward_column(cls, self._where))

    def route(self, row: dict):
        """The routing key of the row's environment (None for a single factory)."""
        if not self.routed:
            return None
        name = row.get("environment")
        if name not in self.pool.factories:
            raise ValueError(
                f"MAGRPOTrainer: a dataset row has environment={name!r}, which is not among the environments passed "
                f"to `environment_factory`: {list(self.pool.factories)}. Each row's 'environment' column names one."
            )
        return name

    def release(self) -> None:
        """A rollout starts: the last one's worlds go back to the pool (its copies are closed)."""
        self.journals = {}
        self.pool.release()

    def start(self, row: dict, prompts: list, count: int) -> tuple[list, list, list | None]:
        """The worlds of a row's `count` joint actions in turn 1: pooled instances, each reset with the row's columns
        (less the routing column), and each agent's first prompt with the reset's observation added to its last
        message (TRL's rule; `observations_per_agent` reads a reset that gives each agent its own).

        Each reset starts from the same global random state (Python's and NumPy's: an environment that draws its task
        from them, or from the row, draws the same one for every joint action), and the state moves on as if the row
        had one world. Returns the worlds, each agent's prompt, and None when every reset returned the same
        observation (the joint actions share one prompt per agent); else, as TRL gives each completion its own
        world's observation, `prompts` as given and each agent's prompt per joint action (`[agent][k]`)."""
        name = self.route(row)
        columns = {k: v for k, v in row.items() if k != "environment"} if self.routed else row
        before = random_state()
        worlds, observations, after = [], [], None
        for _ in range(count):
            world = self.pool.take(name)
            journal = Journal(name, columns, before, None)
            observation, left = self._reset(world, journal)
            after = after or left  # where one reset leaves it, as if the row had one world
            worlds.append(world)
            observations.append(observation)
            self.journals[id(world)] = (world, replace(journal, observation=observation))
        if after is not None:
            set_random_state(after)
        per_agent = [
            observations_per_agent(o, self.num_agents, type(w)) for o, w in zip(observations, worlds, strict=True)
        ]
        if all(o == observations[0] for o in observations[1:]):
            return worlds, with_observations(prompts, per_agent[0] if per_agent else None), None
        cls = type(worlds[0])
        self.own_starts.add(cls)
        logger.info_once(_OWN_START_SAID.format(cls=cls.__name__, count=count))
        own = [with_observations(prompts, observation) for observation in per_agent]  # [k][agent]
        return worlds, list(prompts), [[own[k][i] for k in range(count)] for i in range(self.num_agents)]

    def _reset(self, world, journal: Journal) -> tuple[Any, tuple]:
        """`world.reset(**columns)` from the journal's global random state: its observation and the random state it
        left. The global state is left as it was (a replay must not move the training's random stream)."""
        now = random_state()
        set_random_state(journal.random_state)
        try:
            return world.reset(**journal.columns), random_state()
        except Exception as err:
            message = (
                f"MAGRPOTrainer: {type(world).__name__}.reset(**row) raised {type(err).__name__}: {err}, on the row "
                f"{short_repr(journal.columns)}."
            )
            if is_lost(err):
                raise EnvironmentLost(f"{message} {_LOST}") from err
            raise RuntimeError(message) from err
        finally:
            set_random_state(now)

    def fork(self, world: Any, turn: int) -> Any:
        """A world in `world`'s state for one joint action of `turn` (> 1): `copy.deepcopy`, else the class's
        `_fork()`, else replay (`environments.forks`). Which one a class uses is said once, at WARNING."""
        cls = type(world)
        _, journal = self.journals[id(world)]
        method, why = self.fork_methods.get(cls, "copy"), ""
        forked = None
        if method == "copy":
            try:
                forked = copy.deepcopy(world)
            except Exception as err:
                why = f"copy.deepcopy raised {type(err).__name__}: {err}"
                method = "hook" if callable(getattr(world, FORK_HOOK, None)) else "replay"
        unreplayable = _UNREPLAYABLE.format(
            cls=cls.__name__, why=why or "as it did for an earlier world of the class", hook=FORK_HOOK, turn=turn
        )
        if method == "replay" and cls in self.own_starts:
            raise ValueError(unreplayable)
        if method == "hook":
            forked = getattr(world, FORK_HOOK)()
        if forked is world:
            how = f"{cls.__name__}.__deepcopy__" if method == "copy" else f"{cls.__name__}.{FORK_HOOK}()"
            raise TypeError(
                f"MAGRPOTrainer: {how} returned the same object, so sibling branches would share one world; it must "
                f"return a new {cls.__name__} in the same state."
            )
        if method == "replay":
            forked = self.pool.take(journal.name)
            lost = partial(self._lost, cls, journal, None)  # a replayed call whose world is gone ends the rollout
            call = partial(self.call_tools, lost=lost)
            try:
                replay(forked, journal, lambda w, j: self._reset(w, j)[0], self._tool_dict, call, turn)
            except StartMismatch as err:  # the same row gave another start: no replay can rebuild the world
                self.own_starts.add(cls)
                raise ValueError(f"{unreplayable} ({err})") from err
        else:
            self.pool.adopt(forked)
        if self.fork_methods.get(cls) != method:  # the first fork of the class, or a copy that failed this time
            self.fork_methods[cls] = method
            logger.warning_once(_FORK_SAID[method].format(cls=cls.__name__, why=why, hook=FORK_HOOK))
        self.journals[id(forked)] = (forked, journal.branch(turn))
        return forked

    def tools(self, world: Any, agent: int) -> list[Callable]:
        """Agent `agent`'s tools: the world's methods it may call, bound to this world."""
        return [getattr(world, name) for name in self.agent_names[type(world)][agent]]

    def _tool_dict(self, world: Any, agent: int) -> dict[str, Callable]:
        return {tool.__name__: tool for tool in self.tools(world, agent)}

    def record(self, world: Any, agent: int, calls: list[dict], messages: list[dict]) -> None:
        """The calls of `world`'s tools among one completion's round of `calls` (and their tool `messages`), kept in
        the world's journal so that a fork can replay them. Recorded when they ran, even if the round is rolled back:
        the world changed."""
        _, journal = self.journals[id(world)]
        names = self.agent_names[type(world)][agent]
        ours = [(c, m["content"]) for c, m in zip(calls, messages, strict=True) if _call_name(c) in names]
        if ours:
            journal.rounds.append(Round(journal.turn, agent, [c for c, _ in ours], [m for _, m in ours]))

    def lost(self, world: Any, agent: int, call: dict, error: BaseException) -> EnvironmentLost | None:
        """For the tool loop: the error that ends the rollout when agent `agent`'s `call` of `world`'s own method
        raised one meaning that the world is gone (`environments.faults`); None otherwise (TRL's rule: the agent reads
        the error)."""
        if _call_name(call) not in self.agent_names[type(world)][agent]:
            return None  # a plain tool of `tools=`: TRL's rule, whatever it raised
        return self._lost(type(world), self.journals[id(world)][1], agent, call, error)

    def _lost(self, cls: type, journal: Journal, agent: int | None, call: dict, error: BaseException):
        if not is_lost(error):
            return None
        function = call.get("function", {})
        who = f"agent {agent}'s call" if agent is not None else "replaying the call"
        return EnvironmentLost(
            f"MAGRPOTrainer: the environment {cls.__name__} is gone: {who} {function.get('name')}"
            f"({short_repr(function.get('arguments'))}) in turn {journal.turn} raised {type(error).__name__}: {error}, on "
            f"the row {short_repr(journal.columns)}. {_LOST}"
        )

    def _where(self, world: Any) -> str:
        """The row and turn of `world` (for errors)."""
        entry = self.journals.get(id(world))
        return "" if entry is None else f"on the row {short_repr(entry[1].columns)}, turn {entry[1].turn}"

    def check(self, row: dict, prompts: list, count: int, num_turns: int) -> list:
        """Before any generation: a world for each of `count` placeholder joint actions on `row`: the pool's first
        instance (the probe), reset with the row, for all of them, so that building the trainer constructs no
        instance beyond the probe, as GRPOTrainer's pool; with several turns, one fork of it, so that the class's fork
        method is known (and said) before training, and a start that can be neither copied nor replayed is refused
        (a replayed reset that deals another start). Returns the worlds; `release` gives them back."""
        (world,), _, _ = self.start(row, prompts, 1)
        if num_turns > 1:
            self.fork(world, 2)
        return [world] * count

    def close(self) -> None:
        """Close every instance made (pooled or copied) that defines `close()`, once each."""
        self.journals = {}
        self.pool.close()


_FORK_SAID = {
    "copy": "MAGRPOTrainer: the environment {cls} is forked for each joint action after turn 1 by copy.deepcopy "
    "(one copy of its state per fork).",
    "hook": "MAGRPOTrainer: the environment {cls} cannot be deep-copied ({why}); it is forked for each joint action "
    "after turn 1 by its own {cls}.{hook}().",
    "replay": "MAGRPOTrainer: the environment {cls} cannot be deep-copied ({why}) and defines no {hook}(self); it is "
    "forked for each joint action after turn 1 by replay: a pooled instance is reset with the row and the branch's "
    "earlier tool calls are run on it again, in order, each fork costing a reset and every call since. Replay needs "
    "a deterministic environment, and a replayed result that differs from the recorded one is an error. Define "
    "{cls}.__deepcopy__(self, memo) or {cls}.{hook}(self), returning a new instance in the same state, to fork it "
    "by copying.",
}


_OWN_START_SAID = (
    "MAGRPOTrainer: {cls}.reset(**row) returned different observations for the {count} joint actions of a row (it "
    "draws its own start, not from the row or the global random state). As in GRPOTrainer, which gives each "
    "completion its own environment and observation, each joint action's first prompts hold its own world's "
    "observation, and generation samples one completion per prompt; the row's {count} joint actions are still one "
    "group (each advantage is relative to the others of its row). A reset seeded from the row gives them one shared "
    "prompt."
)

_UNREPLAYABLE = (
    "MAGRPOTrainer: the environment {cls} cannot be forked for the branches of turn {turn}: copy.deepcopy fails "
    "({why}), it defines no {hook}(self), and replay (resetting a pooled instance with the row, then running the "
    "branch's calls again) cannot rebuild its world, because its reset draws its own start: it returned different "
    "observations for the same row (a game dealt on a server without a seed, say). With num_turns > 1, make its start "
    "repeatable (reset from a seed in the row, e.g. a `seed` column passed on to the server's reset, or from Python's "
    "or NumPy's global random state, which each reset of a row starts from), or define {cls}.{hook}(self) or "
    "{cls}.__deepcopy__(self, memo) returning a new instance in the same state (a new session that continues the "
    "game, say). With num_turns=1 no fork is needed and it trains as it is."
)

_LOST = (
    "Its server died or stopped answering (`trl_multiagent.environments.faults`), and the world's state with it, so the "
    "rollout stops here on every process, before this step's update: the checkpoints saved so far are whole. Restart "
    "the server and resume from the last checkpoint (`resume_from_checkpoint`)."
)


def _call_name(call: dict) -> str | None:
    return call.get("function", {}).get("name")


def observations_per_agent(observation, num_agents: int, cls: type) -> list:
    """`reset`'s result as one observation per agent. A tuple, or a list whose items are not content parts (dicts),
    gives each agent its own (hidden information: agent i's is added to agent i's prompt only); anything else (a
    string, None, TRL's list of content parts) is every agent's."""
    if isinstance(observation, tuple) or (
        isinstance(observation, list) and observation and not any(isinstance(o, dict) for o in observation)
    ):
        if len(observation) != num_agents:
            raise ValueError(
                f"MAGRPOTrainer: {cls.__name__}.reset(**row) returned {len(observation)} observations "
                f"({short_repr(observation)}), one per agent, for a team of {num_agents}. Return one per agent (a list or "
                "tuple, None for an agent that gets none), or one string for every agent."
            )
        return list(observation)
    return [observation] * num_agents


def with_observations(prompts: list, observations: list | None) -> list:
    """Each agent's prompt with its own observation added (TRL's rule, `with_observation`); None adds nothing."""
    if observations is None:
        return list(prompts)
    return [
        prompt if observation is None else with_observation(prompt, observation)
        for prompt, observation in zip(prompts, observations, strict=True)
    ]


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


def _reward_column(cls: type, where: Callable[[Any], str]) -> Callable:
    """The world's `get_reward()` as a joint reward function named after its class (TRL's column): one value per joint
    action (one list per joint action, a value per agent, with ``per_agent_reward = True``, which the function keeps as
    its attribute), None for a joint action whose world is of another class. A `get_reward` that raises an error
    meaning its world is gone raises `EnvironmentLost`, with the row and turn (`where(world)`)."""
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

    @contextlib.contextmanager
    def reading(world):
        try:
            yield
        except Exception as err:
            if is_lost(err):
                raise EnvironmentLost(
                    f"MAGRPOTrainer: the environment {cls.__name__} is gone: get_reward() raised "
                    f"{type(err).__name__}: {err}, {where(world)}. {_LOST}"
                ) from err
            raise

    if inspect.iscoroutinefunction(cls.get_reward):

        async def value(world):
            with reading(world):
                return checked(await world.get_reward())

        async def reward(*completions, environments, **kwargs):
            return [await value(e) if type(e) is cls else None for e in environments]

    else:

        def value(world):
            with reading(world):
                return checked(world.get_reward())

        def reward(*completions, environments, **kwargs):
            return [value(e) if type(e) is cls else None for e in environments]

    reward.__name__ = reward.__qualname__ = cls.__name__
    # read where the columns join the rewards (`arguments.functions.user_functions`)
    reward.per_agent_reward = per_agent
    return reward


# The `Worlds` made while a `closes_worlds_on_error` function runs (None outside one): building a trainer makes them
# deep inside `arguments.prepare`, and a failure there or later in the build would leave their instances open.
_made_here: contextvars.ContextVar[list | None] = contextvars.ContextVar("trl_multiagent_worlds", default=None)


def closes_worlds_on_error(function: Callable) -> Callable:
    """`function`, closing the instances of every `Worlds` made while it runs when it raises (then re-raising)."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        made: list = []
        token = _made_here.set(made)
        try:
            return function(*args, **kwargs)
        except BaseException:
            for worlds in made:
                worlds.close()
            raise
        finally:
            _made_here.reset(token)

    return wrapper
