"""Turn-by-turn tree rollout, independent of any model.

`run_rollout` grows one `RolloutTree` for a batch of dataset rows. At each turn it asks `generate` once per agent for
every live node of every row (batched generation), scores every joint action of the turn with one `score` call, ends
the nodes whose mean joint reward is above the early-termination threshold, keeps the joint actions that `branching`
continues (every one, the best, or the top m by joint reward), and asks `transition` for the next prompts of each of
them. The trainer supplies the three callables; tests supply fakes.

A node's K completions per agent share one prompt (K samples of it), except where an environment's `reset` gave the K
joint actions of a row different observations (it draws its own start, as TRL lets it): each completion then has its
own first prompt (`Node.own_prompts`), and that turn's generation takes one sample of each of the K prompts. The K
completions stay one group, as in GRPOTrainer.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from ..credit.options import Branching, JointMode, strategy
from ..credit.returns import continued, joint_choices
from ..generation.output import Generation


@dataclass
class Node:
    """One state of the team: a prompt per agent, and the K completions each agent wrote for it."""

    row: int  # index of the dataset row (in the rollout batch) this tree grows from
    turn: int  # 1-based
    # one prompt per agent, shared by its K completions: text, or chat messages for conversational data. With
    # `own_prompts`, each agent's prompt before the observations were added.
    prompts: list
    parent: int | None  # id of the joint action this node continues; None at a root
    # [agent][k] token ids of completion k's prompt (with one prompt per agent, the same list K times)
    prompt_ids: list[list[list[int]]] = field(default_factory=list)
    # [agent][k] the prompt of completion k of each agent, where the node's joint actions start from different
    # observations (an environment that draws its own start: `worlds.Worlds.start`); None where `prompts` serve all
    own_prompts: list[list] | None = None
    completion_ids: list[list[list[int]]] = field(default_factory=list)  # [agent][k] token ids
    completions: list[list[str]] = field(default_factory=list)  # [agent][k] decoded text
    # [agent][k] per-token log-probs of the sampler, when it reports them (vLLM): the importance-sampling correction
    sampling_logps: list[list[list[float]]] = field(default_factory=list)
    joint_actions: list[int] = field(default_factory=list)  # ids of this node's joint actions
    terminated: bool = False  # ended early: before the last turn, its mean joint reward above the threshold
    # With `environment_factory`, from turn 2: the world its parent joint action left, which each of its joint actions
    # forks (`worlds.Worlds.fork`). None at a root: its joint actions act on pooled instances reset with the row.
    environment: Any = None
    # With tools: [agent][k] 1 on the model's tokens, 0 on tool results (TRL's `tool_mask`), and the calls made and
    # the calls that failed in each completion
    tool_masks: list[list[list[int]]] = field(default_factory=list)
    tool_calls: list[list[int]] = field(default_factory=list)
    tool_failures: list[list[int]] = field(default_factory=list)
    messages: list[list[list[dict] | None]] = field(default_factory=list)  # [agent][k] TRL's completion messages

    def prompt(self, agent: int, k: int):
        """The prompt that agent `agent`'s completion `k` was written for."""
        return self.prompts[agent] if self.own_prompts is None else self.own_prompts[agent][k]


@dataclass
class JointAction:
    """One completion per agent at a node, and the joint reward the team got for it."""

    node: int
    choice: tuple[int, ...]  # completion index per agent
    reward: float = math.nan
    child: int | None = None  # id of the node it expanded into, if the branch went on
    pruned: bool = False  # its node went on, but `branching` did not continue this joint action
    own_rewards: list[float] | None = None  # each agent's own reward, where per-agent rewards exist
    environment: Any = None  # this joint action's own world (a pooled instance in turn 1, a fork later), acted on
    # with multi_objective_aggregation="normalize_then_sum": the reward normalised within its node, which credit uses
    normalized_reward: float | None = None

    @property
    def learned_reward(self) -> float:
        """The reward the returns are made of: `normalized_reward` when there is one, else `reward`."""
        return self.reward if self.normalized_reward is None else self.normalized_reward


@dataclass
class RolloutTree:
    nodes: list[Node] = field(default_factory=list)
    joint_actions: list[JointAction] = field(default_factory=list)

    def children(self) -> list[list[int]]:
        """For each joint action, the joint-action ids of the node it expanded into (empty if it ended)."""
        return [[] if a.child is None else self.nodes[a.child].joint_actions for a in self.joint_actions]

    def pruned(self) -> dict[int, list[int]]:
        """Each joint action that branching did not continue -> the joint actions of its node that were continued."""
        out = {}
        for node in self.nodes:
            kept = [a for a in node.joint_actions if self.joint_actions[a].child is not None]
            out.update({a: kept for a in node.joint_actions if self.joint_actions[a].pruned})
        return out

    def first_worlds(self) -> list:
        """The worlds of the first turn's joint actions, in order (GRPOTrainer's `environments`: one per rollout)."""
        return [
            a.environment for a in self.joint_actions if self.nodes[a.node].turn == 1 and a.environment is not None
        ]

    def action_prompts(self, action_id: int) -> list:
        """The prompt of each agent's completion in one joint action."""
        action = self.joint_actions[action_id]
        return [self.nodes[action.node].prompt(i, k) for i, k in enumerate(action.choice)]

    def answers(self, action_id: int) -> list[str]:
        """The text of each agent's completion in one joint action."""
        action = self.joint_actions[action_id]
        return [self.nodes[action.node].completions[i][k] for i, k in enumerate(action.choice)]

    def history(self, action_id: int) -> tuple[list[list], list[list[str]]]:
        """Prompts and answers per agent along the path from the root to (and including) this joint action."""
        path = []
        current: int | None = action_id
        while current is not None:
            path.append(current)
            current = self.nodes[self.joint_actions[current].node].parent
        path.reverse()
        num_agents = len(self.joint_actions[action_id].choice)
        prompts = [[self.action_prompts(a)[i] for a in path] for i in range(num_agents)]
        answers_along = [self.answers(a) for a in path]
        responses = [[answers[i] for answers in answers_along] for i in range(num_agents)]
        return prompts, responses


def run_rollout(
    rows: Sequence[dict[str, Any]],
    *,
    num_agents: int,
    num_generations: int,
    num_turns: int,
    joint_mode: str | JointMode,
    termination_threshold: float | None,
    agent_prompts: Callable[[dict[str, Any]], list],
    generate: Callable[[int, list, list | None], Generation],
    score: Callable[[int, RolloutTree, list[int]], list[float]],
    transition: Callable[[int, RolloutTree, list[int]], list[list]],
    sync: Callable[[bool, BaseException | None], bool] | None = None,
    worlds=None,
    branching: str | Branching = "all",
    branching_top_m: int | None = None,
) -> RolloutTree:
    """Grow the rollout tree of a batch of rows, turn by turn.

    Args:
        agent_prompts: builds the first-turn prompt of each agent from a row.
        generate: ``generate(agent, prompts, environments, samples)`` samples `samples` completions for each prompt
            with one batched call (K, or 1 where the completions have their own prompts, `Node.own_prompts`);
            `environments` is None, or the world each completion acts on (prompt-major, `samples` per prompt).
        score: ``score(turn, tree, action_ids)`` returns the joint reward of each listed joint action.
        transition: ``transition(turn, tree, action_ids)`` returns, for each listed joint action that goes on, the next
            prompt of each agent (one call per turn, so that async transitions can run concurrently).
        joint_mode, branching: the strategies (`credit.options`; the trainer's `CreditRules`) or their names, looked
            up here once. `branching` (with `branching_top_m`) says which joint actions of a node that goes on are
            continued (`MAGRPOConfig.branching`); the others are marked `pruned`.
        sync: called at the end of every turn with whether this process has live nodes and the error its generation,
            reward or transition raised (or None); returns whether to run another turn, and raises if any process failed.
            Distributed training makes it agree across processes, so that every rank runs the same number of
            `generate` calls (a rank without live nodes then calls `generate` with no prompts) and a failure on one
            rank stops every rank at once instead of leaving them waiting in a collective. By default: re-raise the
            error, go on while there are live nodes.
    """
    sync = sync or local_sync
    tree = RolloutTree()
    choices = joint_choices(num_agents, num_generations, joint_mode)
    keep = partial(continued, branching=strategy("branching", branching, branching_top_m), top_m=branching_top_m)
    live, forks = [], {}  # forks: live node -> the world of each of its joint actions (aligned: completion k's)
    if worlds is not None:
        worlds.release()  # the last rollout's worlds go back to the pool
    for r, row in enumerate(rows):
        tree.nodes.append(Node(row=r, turn=1, prompts=list(agent_prompts(row)), parent=None))
        live.append(len(tree.nodes) - 1)
    if worlds is not None:  # turn 1 needs no copy: one pooled instance per joint action, reset with the row
        error = None
        try:
            for n in live:
                node = tree.nodes[n]
                forks[n], node.prompts, node.own_prompts = worlds.start(rows[node.row], node.prompts, num_generations)
        except Exception as err:
            error = err
        # A reset that failed (its server gone, say) stops every process here, before any generation's collectives.
        sync(True, error)

    for turn in range(1, num_turns + 1):
        # A failure in this turn's generation, reward or transition is handed to `sync`, which re-raises it here and
        # stops the other processes too, instead of leaving them waiting in the next collective.
        try:
            # Joint action k of a later node acts on its own fork of the node's world (aligned: completion k of each agent)
            if worlds is not None and turn > 1:
                forks = {
                    n: [worlds.fork(tree.nodes[n].environment, turn) for _ in range(num_generations)] for n in live
                }
            acted_on = [world for n in live for world in forks[n]] if worlds is not None else None
            # One batched call per agent: K samples of each node's prompt, or, when any node's completions have
            # their own prompts, one sample of each completion's prompt (a shared prompt then repeated K times)
            own = any(tree.nodes[n].own_prompts is not None for n in live)
            for agent in range(num_agents):
                if own:
                    prompts = [tree.nodes[n].prompt(agent, k) for n in live for k in range(num_generations)]
                    generation = generate(agent, prompts, acted_on, 1)
                else:
                    prompts = [tree.nodes[n].prompts[agent] for n in live]
                    generation = generate(agent, prompts, acted_on, num_generations)
                _add_generation(tree, live, agent, generation, num_generations, own)
            new_actions = []
            for n in live:
                for choice in choices:
                    world = forks[n][choice[0]] if worlds is not None else None
                    tree.joint_actions.append(JointAction(node=n, choice=choice, environment=world))
                    tree.nodes[n].joint_actions.append(len(tree.joint_actions) - 1)
                    new_actions.append(len(tree.joint_actions) - 1)
            live = _score_and_expand(
                tree, live, new_actions, turn, num_turns, termination_threshold, score, transition, keep
            )
            error = None
        except Exception as err:
            if getattr(err, AGREED, False):  # every process already stopped on it (a world lost in a tool round)
                raise
            error, live = err, []
        if not sync(bool(live), error) or turn == num_turns:
            break
    return tree


def _add_generation(
    tree: RolloutTree, live: list[int], agent: int, gen: Generation, num_generations: int, own_prompts: bool
) -> None:
    """Store one agent's completions (K per live node, prompt-major) in their nodes; `own_prompts`: `gen` holds one
    prompt per completion, else one per node."""
    for j, n in enumerate(live):
        node = tree.nodes[n]
        span = slice(j * num_generations, (j + 1) * num_generations)
        node.prompt_ids.append(gen.prompt_ids[span] if own_prompts else [gen.prompt_ids[j]] * num_generations)
        node.completion_ids.append(gen.completion_ids[span])
        node.completions.append(gen.completions[span])
        if gen.sampling_logps is not None:
            node.sampling_logps.append(gen.sampling_logps[span])
        if gen.tool_masks is not None:
            node.tool_masks.append(gen.tool_masks[span])
            node.tool_calls.append(gen.tool_calls[span])
            node.tool_failures.append(gen.tool_failures[span])
            node.messages.append(gen.messages[span] if gen.messages is not None else [None] * num_generations)


def _score_and_expand(tree, live, new_actions, turn, num_turns, threshold, score, transition, keep) -> list[int]:
    """Score a turn's joint actions, end nodes above the threshold, and open the next turn's nodes for the joint
    actions that `keep(rewards)` continues."""
    rewards = score(turn, tree, new_actions) if new_actions else []
    for a, reward in zip(new_actions, rewards, strict=True):
        tree.joint_actions[a].reward = float(reward)
    going_on = []
    for n in live:
        node = tree.nodes[n]
        mean_reward = sum(tree.joint_actions[a].reward for a in node.joint_actions) / len(node.joint_actions)
        # the last turn's nodes end anyway: none of them ended early, whatever its reward
        node.terminated = turn < num_turns and threshold is not None and mean_reward > threshold
        if turn < num_turns and not node.terminated:
            kept = keep([tree.joint_actions[a].reward for a in node.joint_actions])
            for j, a in enumerate(node.joint_actions):
                tree.joint_actions[a].pruned = j not in kept
            going_on.extend(node.joint_actions[j] for j in kept)
    next_live = []
    for a, prompts in zip(going_on, transition(turn, tree, going_on) if going_on else [], strict=True):
        node = tree.nodes[tree.joint_actions[a].node]
        world = tree.joint_actions[a].environment  # the branch goes on in the world its joint action left
        tree.nodes.append(Node(row=node.row, turn=turn + 1, prompts=list(prompts), parent=a, environment=world))
        tree.joint_actions[a].child = len(tree.nodes) - 1
        next_live.append(len(tree.nodes) - 1)
    return next_live


# Set on an exception that `sync` raised on every process at once: `run_rollout` re-raises it as it is, with no
# second agreement that the processes which already stopped would never join.
AGREED = "_trl_multiagent_agreed"


def agreed(error: BaseException) -> BaseException:
    """`error`, marked as raised on every process (`AGREED`)."""
    setattr(error, AGREED, True)
    return error


def local_sync(has_live_nodes: bool, error: BaseException | None = None) -> bool:
    """`run_rollout`'s end-of-turn rule on one process: re-raise a failure, go on while nodes are live."""
    if error is not None:
        raise agreed(error)
    return has_live_nodes
