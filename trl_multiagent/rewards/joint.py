"""The team's reward: joint reward functions, per-agent rewards in TRL's convention, and their weighted sum.

Every entry of `reward_funcs` follows one of three conventions. A function wrapped in `joint`, `per_agent` or
`per_joint_action` (`rewards.wrappers`) follows the one it states; any other is read from its signature
(`rewards.signatures`), which says so once, at WARNING, with how to state it:

* **Per-agent, TRL's** (`is_per_agent`): a model id or a model (a sequence-classification reward model), a function
  wrapped in `per_agent`, or a function that names `completions` or `completion_ids` and takes ``**kwargs`` (all of
  ``trl.rewards``, a TRL recipe's own rewards; the functions of TRL's own package are not warned about). It scores one
  agent's completions, called as TRL calls it (``f(prompts=, completions=, completion_ids=, trainer_state=,
  <dataset columns>)``) once per agent; the agents' values become the joint reward by
  `MAGRPOConfig.agent_reward_aggregation` (mean over agents by default).
* **Joint, batched** (`joint`, and the default for every other function): ``f(completions_agent_0,
  completions_agent_1, ...)``, one list per agent aligned by joint action, returns one value per joint action. A
  function with a single positional parameter gets one list of the agents' lists instead. The
  completion lists fill the leading positional parameters that are not keywords the trainer passes (nor dataset
  columns): a function whose parameters are all such keywords, TRL's environment reward ``f(environments,
  **kwargs)`` or ``f(**kwargs)``, gets no completion list and is called by keywords only, once per turn, to score each
  joint action from its world (`environments`, one per joint action). Read from the signature, this says so once at
  WARNING.
* **Joint, one joint action per call** (`per_joint_action`, stated only): called once per joint action, with
  one-element lists, ``rows=[row]`` and ``prompts=[agent 0's prompt]``; it returns one value or a list of one.

A convention is read from the signature or the wrapper alone, never from what a call returns: an unwrapped joint
function that returns one value for several joint actions is a count error, which names `per_joint_action`.

Keywords are passed only when the function names them or takes ``**kwargs``: those of `REWARD_KEYWORDS` (each says
what it holds) and the dataset columns.
"""

from __future__ import annotations

import inspect
import numbers
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers.utils import logging
from trl.data_utils import is_conversational

from ..callables import callable_name, pick_keywords, run_awaitable, unbound_parameters
from .log_extra import bound_log_extra
from .models import reward_name, score_with_model
from .signatures import PER_AGENT_NAMES, completion_slots, is_per_agent, say_inferred
from .values import check_agent_rewards, check_rewards
from .wrappers import stated_convention


logger = logging.get_logger(__name__)

AGENT_REWARD_AGGREGATIONS = {"mean": lambda values: sum(values) / len(values), "sum": sum, "min": min, "max": max}


@dataclass(frozen=True)
class RewardKeyword:
    """A keyword the trainer passes the reward functions: what it holds, and how each convention gets it."""

    doc: str
    per_joint_action: bool  # one value per joint action: a call of one joint action (`per_joint_action`) gets its own
    per_agent_call: bool  # a per-agent reward (TRL's convention) gets it as it is


# The one list of the reward's keywords (`JointReward` binds them, `environment.TeamTask.reward_keywords` gives
# their values, `arguments.datasets.check_column_names` keeps the dataset's columns off their names).
REWARD_KEYWORDS = {
    "prompts": RewardKeyword("each agent's prompt per joint action (a per-agent reward: its agent's)", True, False),
    "turn": RewardKeyword("the turn, from 1", False, False),
    "trainer_state": RewardKeyword("the Trainer's `TrainerState`", False, True),
    "rows": RewardKeyword("the dataset row of each joint action", True, False),
    "log_metric": RewardKeyword(
        "TRL's `log_metric(name, value)`: a scalar logged with the step's metrics", False, True
    ),
    "log_extra": RewardKeyword(
        "TRL's `log_extra(column, values)`: a column of the completions table, one value per joint action (per "
        "completion for a per-agent reward)",
        False,
        True,
    ),
    "environments": RewardKeyword(
        "with `environment_factory`, each joint action's world (`environments.worlds`)", True, True
    ),
}


def check_agent_reward_aggregation(value, num_agents: int | None) -> None:
    """`MAGRPOConfig.agent_reward_aggregation`: a name of `AGENT_REWARD_AGGREGATIONS`, or an agent's index."""
    if str(value) in AGENT_REWARD_AGGREGATIONS:
        return
    index = _agent_index(value)
    if index is None or (num_agents is not None and index >= num_agents):
        agents = f" (0..{num_agents - 1})" if num_agents is not None else ""
        raise ValueError(
            f"MAGRPOConfig: agent_reward_aggregation must be one of {list(AGENT_REWARD_AGGREGATIONS)} or an agent's "
            f"index{agents}, got {value!r}."
        )


def _agent_index(value) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int) or (isinstance(value, str) and value.isdigit()):
        return int(value)
    return None


def aggregate_agents(aggregation, per_agent: list[list[float | None]]) -> list[float | None]:
    """Per joint action, the agents' values combined: by name (None values left out; None if all are), or one agent's.

    >>> aggregate_agents("mean", [[1.0, None], [3.0, None]])
    [2.0, None]
    >>> aggregate_agents("1", [[1.0, 2.0], [3.0, 4.0]])
    [3.0, 4.0]
    """
    index = _agent_index(aggregation)
    if index is not None:
        return list(per_agent[index])
    how = AGENT_REWARD_AGGREGATIONS[str(aggregation)]
    out = []
    for values in zip(*per_agent, strict=True):
        known = [v for v in values if v is not None]
        out.append(how(known) if known else None)
    return out


def resolve_weights(weights: Sequence[float] | None, names: list[str], world_rewards: list) -> list[float] | None:
    """`reward_weights` for the reward functions (`names`) followed by the environments' `get_reward` columns. TRL's
    rule: `reward_weights` covers the reward functions and each column gets weight 1 after them; a team may also give
    one weight more per column to set it. None: every weight 1.

    >>> resolve_weights([0.5], ["format"], [lambda: 0])
    [0.5, 1.0]
    >>> resolve_weights([0.5, 2.0], ["format"], [lambda: 0])
    [0.5, 2.0]
    """
    if weights is None or not world_rewards:
        return None if weights is None else list(weights)
    columns = [callable_name(f) for f in world_rewards]
    if len(weights) == len(names):
        return [*weights, *[1.0] * len(world_rewards)]  # TRL's weight for an environment's reward
    if len(weights) == len(names) + len(world_rewards):
        return list(weights)
    raise ValueError(
        f"MAGRPOConfig: reward_weights has {len(weights)} weights ({list(weights)}) for the {len(names)} reward "
        f"functions {names} and the environments' get_reward columns {columns}. Give {len(names)} (one per reward "
        f"function; each column then gets weight 1, as in TRL) or {len(names) + len(world_rewards)} (the columns' "
        "weights last)."
    )


class JointReward:
    """The weighted sum of the team's reward functions, each called by its convention (see the module docstring)."""

    def __init__(
        self,
        funcs: Sequence[Callable],
        weights: Sequence[float] | None,
        num_agents: int,
        columns: Sequence[str] = (),
        agent_aggregation="mean",
        multi_objective_aggregation: str = "sum_then_normalize",
    ):
        self.funcs = list(funcs)
        self.normalize_then_sum = multi_objective_aggregation == "normalize_then_sum"
        self.agent_aggregation = agent_aggregation
        if not self.funcs:
            raise ValueError(
                "MAGRPOTrainer: No reward source provided. Pass `reward_funcs=`, or an "
                "`environment_factory` whose environment defines a `get_reward` method."
            )
        self.weights = [1.0] * len(self.funcs) if weights is None else [float(w) for w in weights]
        if len(self.weights) != len(self.funcs):
            raise ValueError(
                f"MAGRPOTrainer got {len(self.weights)} reward_weights for {len(self.funcs)} reward functions."
            )
        self.names = [reward_name(f) for f in self.funcs]
        self.num_agents = num_agents
        self.per_agent = [is_per_agent(f) for f in self.funcs]
        stated = [stated_convention(f) for f in self.funcs]
        self.each_agent = [c == "each_agent" for c in stated]
        self.one_action_per_call = [c == "per_joint_action" for c in stated]  # else all joint actions in one call
        self.one_list = [False] * len(self.funcs)
        self.by_keywords = [False] * len(self.funcs)  # joint, with no completion list: TRL's f(environments, **kwargs)
        self.processing_classes: list = [None] * len(self.funcs)
        for f, (func, name) in enumerate(zip(self.funcs, self.names, strict=True)):
            if self.per_agent[f]:
                if not isinstance(func, (str, torch.nn.Module)):
                    self._check_binds(func, name, [], PER_AGENT_NAMES, columns, "as TRL calls it, by keywords")
                say_inferred(func, name, per_agent=True, one_list=False, num_agents=num_agents)
                continue
            if not callable(func):
                raise TypeError(f"Reward {name!r} is not callable: got {type(func).__name__}.")
            slots = completion_slots(func, [*REWARD_KEYWORDS, *columns])
            self.by_keywords[f] = slots == 0
            self.one_list[f] = num_agents > 1 and slots == 1
            args = [] if self.by_keywords[f] else [[]] if self.one_list[f] else [[]] * num_agents
            shape = (
                "no completion list (its parameters are all keywords)"
                if self.by_keywords[f]
                else "one list of the agents' completion lists"
                if self.one_list[f]
                else (f"{num_agents} positional lists of completions (one per agent)")
            )
            self._check_binds(func, name, args, (), columns, f"with {shape}")
            say_inferred(func, name, per_agent=False, one_list=self.one_list[f], by_keywords=self.by_keywords[f])

    def _check_binds(self, func, name, args, required, columns, how: str) -> None:
        keywords = pick_keywords(func, dict.fromkeys([*REWARD_KEYWORDS, *required, *columns]))
        try:
            inspect.signature(func).bind(*args, **keywords)
        except TypeError as err:
            unknown = unbound_parameters(func, args, keywords, [*REWARD_KEYWORDS, *required], columns)
            raise TypeError(
                f"Reward function {name!r} cannot be called {how} and the keywords {sorted(keywords)}: {err}.{unknown} "
                f"Its signature is {name}{inspect.signature(func)}."
            ) from None

    def bind_models(self, funcs: Sequence, processing_classes: Sequence) -> None:
        """The reward models as GRPOTrainer loaded and prepared them, with their tokenizers."""
        for f, (func, processing_class) in enumerate(zip(funcs, processing_classes, strict=True)):
            if isinstance(func, torch.nn.Module):
                self.funcs[f], self.processing_classes[f] = func, processing_class

    def _ready(self, f: int) -> bool:
        """A function, or a reward model loaded and given its tokenizer (`bind_models`)."""
        func = self.funcs[f]
        return not isinstance(func, str) and not (
            isinstance(func, torch.nn.Module) and self.processing_classes[f] is None
        )

    def __call__(
        self,
        completions: list[list[str]],
        turn: int,
        keywords: dict[str, Any],
        completion_ids: list[list[list[int]]] | None = None,
        messages: list[list[list[dict] | None]] | None = None,
    ) -> tuple[list[float], list, dict[int, list[list[float | None]]]]:
        """Joint reward per joint action (weighted sum over functions), each function's
        joint values, and each per-agent function's values per agent (function index -> [agent][joint action]).
        `messages` ([agent][joint action], with tools): each completion as TRL's reward functions get it, the
        assistant turns and tool results (None for an agent without tools: its text as one assistant message)."""
        count = len(completions[0])
        keywords = {**keywords, "turn": turn}
        per_func, per_agent = [], {}
        for f in range(len(self.funcs)):
            if not self._ready(f):
                continue  # a reward model not loaded yet: the build-time check runs before GRPOTrainer prepares it
            if self.per_agent[f]:
                per_agent[f] = [
                    self._agent_values(f, i, completions[i], completion_ids, keywords, turn, messages)
                    for i in range(self.num_agents)
                ]
                per_func.append(aggregate_agents(self.agent_aggregation, per_agent[f]))
            elif self.each_agent[f]:
                values = self._call_joint(f, completions, keywords, list(range(count)), turn)
                per_agent[f] = check_agent_rewards(self.names[f], values, count, self.num_agents, turn)
                per_func.append(aggregate_agents(self.agent_aggregation, per_agent[f]))
            else:
                per_func.append(self._joint_values(f, completions, keywords, count, turn))
        return self._weighted_sum(per_func, count), per_func, per_agent

    def _weighted_sum(self, per_func: list[list[float | None]], count: int) -> list[float]:
        scored = [w for f, w in enumerate(self.weights) if self._ready(f)]
        total = []
        for j in range(count):
            values = [w * vals[j] for w, vals in zip(scored, per_func, strict=True) if vals[j] is not None]
            total.append(sum(values) if values else 0.0)
        return total

    def normalized_sum(self, per_func: list[list[float | None]], groups: Sequence[int]) -> list[float]:
        """TRL's `multi_objective_aggregation="normalize_then_sum"`: each function's values normalised within their
        group (`group_normalized`; a group is the joint actions of one node), then weighted and summed.

        >>> def a(completions_0): return [1.0, 3.0]
        >>> def b(completions_0): return [10.0, 10.0]
        >>> JointReward([a, b], [1.0, 2.0], num_agents=1).normalized_sum([[1.0, 3.0], [10.0, 10.0]], [0, 0])
        [-0.7070..., 0.7070...]
        """
        return self._weighted_sum([group_normalized(values, groups) for values in per_func], len(groups))

    @property
    def gives_own_rewards(self) -> bool:
        """Whether some function gives each agent its own value (per-agent, or a joint `each_agent` one)."""
        return any(p or e for p, e in zip(self.per_agent, self.each_agent, strict=True))

    def own_rewards(self, per_func: list, per_agent: dict, turn: int) -> list[list[float]] | None:
        """Each agent's own reward per joint action (``[joint action][agent]``), from `__call__`'s values: the same
        weighted sum, with each per-agent function's value for that agent in place of the agents' aggregate. None
        when no function is per-agent (every agent's own reward would be the team's).

        >>> def length(completions, **kwargs):
        ...     return [float(len(c)) for c in completions]
        >>> from trl_multiagent import per_agent
        >>> reward = JointReward([per_agent(length)], None, num_agents=2)
        >>> total, per_func, by_agent = reward([["ab"], ["wxyz"]], 1, {})
        >>> total, reward.own_rewards(per_func, by_agent, 1)
        ([3.0], [[2.0, 4.0]])
        """
        if not per_agent:
            return None
        scored = [f for f in range(len(self.funcs)) if self._ready(f)]
        own = [[0.0] * self.num_agents for _ in per_func[0]]
        for position, f in enumerate(scored):
            for i in range(self.num_agents):
                values = per_agent[f][i] if f in per_agent else per_func[position]
                for j, value in enumerate(values):
                    if value is not None:
                        own[j][i] += self.weights[f] * value
        return own

    def _joint_values(self, f: int, completions, keywords: dict, count: int, turn: int) -> list[float | None]:
        name = self.names[f]
        if self.one_action_per_call[f]:
            return [self._one_action(f, completions, keywords, j, turn) for j in range(count)]
        values = self._call_joint(f, completions, keywords, list(range(count)), turn)
        return check_rewards(name, values, count, turn, joint=True)

    def _call_joint(self, f: int, completions, keywords: dict, actions: list[int], turn: int):
        func = self.funcs[f]
        args = [] if self.by_keywords[f] else [list(completions)] if self.one_list[f] else completions
        keywords = self._with_log_extra(f, keywords, actions, turn)
        return run_awaitable(func(*args, **pick_keywords(func, keywords)))

    def _one_action(self, f: int, completions, keywords: dict, j: int, turn: int) -> float | None:
        """Joint action `j` alone (`per_joint_action`): every list (and keyword list) cut to its one element."""
        one = {}
        for key, value in keywords.items():
            if key == "prompts":
                one[key] = [value[0][j]]  # the prompt of joint action j (agent 0's)
            elif REWARD_KEYWORDS[key].per_joint_action if key in REWARD_KEYWORDS else isinstance(value, list):
                one[key] = [value[j]]  # the rows, the worlds, or a dataset column
            else:
                one[key] = value
        values = self._call_joint(f, [[c[j]] for c in completions], one, [j], turn)
        if isinstance(values, numbers.Real) and not isinstance(values, bool):
            values = [values]  # one value, not in a list
        name = self.names[f]
        return check_rewards(
            name, values, 1, turn, f", called once per joint action as per_joint_action({name}) states"
        )[0]

    def _with_log_extra(self, f: int, keywords: dict, actions: list[int], turn: int, agent: int | None = None):
        """`keywords` with TRL's `log_extra` bound to one call of function `f` (`log_extra.bound_log_extra`)."""
        sink = keywords.get("log_extra")
        if sink is None:
            return keywords
        name = self.names[f] if agent is None else f"{self.names[f]}, agent {agent}"
        return {**keywords, "log_extra": bound_log_extra(sink, self.names, name, actions, turn, agent)}

    def _agent_values(self, f: int, agent: int, completions, completion_ids, keywords: dict, turn: int, messages=None):
        func, name = self.funcs[f], f"{self.names[f]}, agent {agent}"
        prompts = keywords.get("prompts", [[""] * len(completions)] * self.num_agents)[agent]
        conversational = bool(prompts) and is_conversational({"prompt": prompts[0]})
        if isinstance(func, torch.nn.Module):
            values = score_with_model(func, self.processing_classes[f], prompts, completions, conversational)
            return check_rewards(name, values, len(completions), turn)
        texts = [[{"role": "assistant", "content": c}] for c in completions] if conversational else completions
        if messages is not None and messages[agent][0] is not None:
            texts = messages[agent]
        ids = completion_ids[agent] if completion_ids is not None else [[] for _ in completions]
        trl_keywords = {
            k: v for k, v in keywords.items() if k not in REWARD_KEYWORDS or REWARD_KEYWORDS[k].per_agent_call
        }
        trl_keywords = self._with_log_extra(f, trl_keywords, list(range(len(completions))), turn, agent)
        trl_keywords.update(prompts=prompts, completions=texts, completion_ids=ids)
        values = run_awaitable(func(**pick_keywords(func, trl_keywords)))
        return check_rewards(name, values, len(completions), turn)


def group_normalized(values: Sequence[float | None], groups: Sequence[int]) -> list[float | None]:
    """Each value minus its group's mean, over its group's std plus 1e-4 (Bessel-corrected; None values skipped and
    kept): TRL's `multi_objective_aggregation="normalize_then_sum"`, done to each reward function within each node.

    >>> group_normalized([1.0, 3.0, None, 5.0, 5.0], [0, 0, 0, 1, 1])
    [-0.7070..., 0.7070..., None, 0.0, 0.0]
    """
    normalized: list[float | None] = list(values)
    for group in dict.fromkeys(groups):
        members = [j for j, g in enumerate(groups) if g == group and values[j] is not None]
        if not members:
            continue
        scored = [values[j] for j in members]
        mean = sum(scored) / len(scored)
        std = statistics.stdev(scored) if len(scored) > 1 else 0.0
        for j in members:
            normalized[j] = (values[j] - mean) / (std + 1e-4)
    return normalized
