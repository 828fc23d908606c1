"""Rollout metrics: per-turn rewards and returns, early termination, completion lengths. No model, no collectives.

Each process summarises its own trees in a `RolloutStats` (small and picklable); the trainer gathers one per process
with a single `gather_object` and `rollout_metrics` turns the list into the logged values.
"""

from __future__ import annotations

import numbers
import statistics
from collections import deque
from dataclasses import dataclass, field

import torch

from .rollout import RolloutTree


@dataclass
class RolloutStats:
    actions: list[tuple[int, float, float]]  # (turn, joint reward, return) per joint action
    nodes: list[tuple[int, bool]]  # (turn, ended by the threshold) per node
    zero_std_groups: list[bool]  # per (node, agent) group: all K returns equal
    completion_lengths: list[list[int]]  # per agent, tokens per completion
    reward_values: dict[int, list[list[float]]] = field(default_factory=dict)  # turn -> per function, scored values
    # (function, agent) -> a per-agent reward's values for that agent (TRL's convention, see `rewards`)
    agent_reward_values: dict[tuple[int, int], list[float]] = field(default_factory=dict)
    tokens: int = 0  # prompt and completion tokens of the rows, every agent
    truncated_prompts: int = 0  # prompts shortened to `max_prompt_length`
    # with tools: (turn, agent) -> [completions, tool calls, failed calls]
    tool_counts: dict[tuple[int, int], list[int]] = field(default_factory=dict)


def rollout_stats(
    tree: RolloutTree,
    returns: list[float],
    credited: torch.Tensor,
    reward_values: dict[int, list[list[float]]],
    agent_reward_values: dict[tuple[int, int], list[float]] | None = None,
    tokens: int = 0,
    truncated_prompts: int = 0,
) -> RolloutStats:
    actions = [(tree.nodes[a.node].turn, a.reward, returns[j]) for j, a in enumerate(tree.joint_actions)]
    num_agents = len(tree.nodes[0].completion_ids) if tree.nodes else 0
    tool_counts = {}
    for node in tree.nodes:
        for i, (calls, failures) in enumerate(zip(node.tool_calls, node.tool_failures, strict=True)):
            counts = tool_counts.setdefault((node.turn, i), [0, 0, 0])
            counts[0] += len(calls)
            counts[1] += sum(calls)
            counts[2] += sum(failures)
    return RolloutStats(
        actions=actions,
        nodes=[(node.turn, node.terminated) for node in tree.nodes],
        zero_std_groups=(credited.flatten(0, 1).std(dim=1) < 1e-8).tolist() if credited.size(-1) > 1 else [],
        completion_lengths=[[n for node in tree.nodes for n in model_tokens(node, i)] for i in range(num_agents)],
        reward_values=reward_values,
        agent_reward_values=dict(agent_reward_values or {}),
        tokens=tokens,
        truncated_prompts=truncated_prompts,
        tool_counts=tool_counts,
    )


def model_tokens(node, agent: int) -> list[int]:
    """Per completion of `agent` at `node`, the tokens the model wrote (tool results not counted, as in TRL)."""
    if node.tool_masks:
        return [sum(mask) for mask in node.tool_masks[agent]]
    return [len(ids) for ids in node.completion_ids[agent]]


def tool_metrics(stats: list[RolloutStats]) -> dict[str, float]:
    """TRL's `tools/call_frequency` (calls per completion) and `tools/failure_frequency` (failed calls per call), in
    total and for each turn and agent.

    >>> tool_metrics([RolloutStats([], [], [], [], tool_counts={(1, 0): [4, 2, 1], (1, 1): [4, 0, 0]})])
    {'turn_1/agent_0/tools/call_frequency': 0.5, 'turn_1/agent_0/tools/failure_frequency': 0.5, 'turn_1/agent_1/tools/call_frequency': 0.0, 'turn_1/agent_1/tools/failure_frequency': 0.0, 'tools/call_frequency': 0.25, 'tools/failure_frequency': 0.5}
    """
    totals: dict[tuple[int, int], list[int]] = {}
    for s in stats:
        for key, counts in s.tool_counts.items():
            totals[key] = [a + b for a, b in zip(totals.get(key, [0, 0, 0]), counts, strict=True)]
    if not totals:
        return {}
    metrics = {}
    for (turn, agent), (completions, calls, failures) in sorted(totals.items()):
        metrics[f"turn_{turn}/agent_{agent}/tools/call_frequency"] = calls / max(completions, 1)
        metrics[f"turn_{turn}/agent_{agent}/tools/failure_frequency"] = failures / calls if calls else 0.0
    completions, calls, failures = (sum(c[j] for c in totals.values()) for j in range(3))
    metrics["tools/call_frequency"] = calls / max(completions, 1)
    metrics["tools/failure_frequency"] = failures / calls if calls else 0.0
    return metrics


def _mean(values) -> float:
    return sum(values) / len(values)


def _std(values) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


def rollout_metrics(
    stats: list[RolloutStats], num_turns: int, reward_names: list[str], max_completion_length: int
) -> dict[str, float]:
    """The logged values, from every process's `RolloutStats`."""
    actions = [a for s in stats for a in s.actions]
    nodes = [n for s in stats for n in s.nodes]
    zero_std = [z for s in stats for z in s.zero_std_groups]
    rewards = [r for _, r, _ in actions]
    metrics = {"reward": _mean(rewards), "reward_std": _std(rewards)}
    if zero_std:
        metrics["frac_reward_zero_std"] = _mean(zero_std)
    for t in range(1, num_turns + 1):
        turn_rewards = [r for turn, r, _ in actions if turn == t]
        if not turn_rewards:
            continue
        metrics[f"turn_{t}/reward_mean"] = _mean(turn_rewards)
        metrics[f"turn_{t}/reward_std"] = _std(turn_rewards)
        metrics[f"turn_{t}/expected_return"] = _mean([g for turn, _, g in actions if turn == t])
        metrics[f"turn_{t}/terminated_frac"] = _mean([done for turn, done in nodes if turn == t])
        for f, name in enumerate(reward_names):
            values = [v for s in stats for v in s.reward_values.get(t, [[]] * len(reward_names))[f]]
            if values:
                metrics[f"turn_{t}/rewards/{name}/mean"] = _mean(values)

    for f, name in enumerate(reward_names):  # TRL's keys: each function over every turn's scored values
        values = [v for s in stats for per_function in s.reward_values.values() for v in per_function[f]]
        if values:
            metrics[f"rewards/{name}/mean"] = _mean(values)
            metrics[f"rewards/{name}/std"] = _std(values)

    for f, i in sorted({key for s in stats for key in s.agent_reward_values}):
        values = [v for s in stats for v in s.agent_reward_values.get((f, i), [])]
        if values:
            metrics[f"agent_{i}/rewards/{reward_names[f]}/mean"] = _mean(values)

    all_lengths = []
    for i in range(len(stats[0].completion_lengths)):
        lengths = [n for s in stats for n in s.completion_lengths[i]]
        metrics[f"agent_{i}/completions/mean_length"] = _mean(lengths)
        all_lengths += lengths
    metrics["completions/mean_length"] = _mean(all_lengths)
    metrics["completions/min_length"] = float(min(all_lengths))
    metrics["completions/max_length"] = float(max(all_lengths))
    metrics["completions/clipped_ratio"] = _mean([n >= max_completion_length for n in all_lengths])
    # TRL's terminated lengths: completions that ended before the limit (0 when none did, as TRL logs it)
    terminated = [n for n in all_lengths if n < max_completion_length] or [0]
    metrics["completions/mean_terminated_length"] = _mean(terminated)
    metrics["completions/min_terminated_length"] = float(min(terminated))
    metrics["completions/max_terminated_length"] = float(max(terminated))
    metrics["prompts/truncated"] = sum(s.truncated_prompts for s in stats)
    metrics.update(tool_metrics(stats))
    return metrics


def completion_log_rows(tree: RolloutTree, advantages: torch.Tensor, record) -> list:
    """One row per completion of the tree (agent, turn, prompt, completion, advantage, and each reward function's
    mean joint value over the joint actions it took part in), for `log_completions`' table; from the rollout's
    `rollout.task.TaskRecord`: its `action_rewards` and the rewards' `log_extra` columns (`extra_columns`:
    column -> {(joint action id, agent or None): value}; each completion gets its joint actions' `extra_value`)."""
    action_rewards, reward_names = record.action_rewards, record.reward_names
    rows = []
    for n, node in enumerate(tree.nodes):
        for i, completions in enumerate(node.completions):
            for k, completion in enumerate(completions):
                actions = [a for a in node.joint_actions if tree.joint_actions[a].choice[i] == k]
                rewards = {}
                for f, name in enumerate(reward_names):
                    values = [action_rewards[a][f] for a in actions if action_rewards[a][f] is not None]
                    rewards[name] = _mean(values) if values else None
                row = {
                    "agent": i,
                    "turn": node.turn,
                    "prompt": node.prompt(i, k),
                    "completion": completion,
                    "advantage": float(advantages[n, i, k]),
                    "rewards": rewards,
                }
                if node.tool_calls:  # the agents had tools
                    row["tool_calls"] = node.tool_calls[i][k]
                row["log_extra"] = {
                    column: extra_value([values.get((a, i), values.get((a, None))) for a in actions])
                    for column, values in record.extra_columns.items()
                }
                rows.append(row)
    return rows


def extra_value(values: list):
    """A completion's cell of a `log_extra` column, from the values of the joint actions it took part in (several
    with `joint_mode="cross"`): the value they share, their mean when they are numbers (as the rewards columns), else
    their list; None without any.

    >>> extra_value(["a", "a"]), extra_value([1, 2.0, None]), extra_value(["a", "b"]), extra_value([None])
    ('a', 1.5, ['a', 'b'], None)
    """
    values = [v for v in values if v is not None]
    if not values:
        return None
    if all(v == values[0] for v in values[1:]):
        return values[0]
    if all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in values):
        return _mean(values)
    return values


def completion_logs(rows: list[dict]) -> dict:
    """`completion_log_rows` of every process in the layout of GRPOTrainer's `_logs`, which its `log` prints
    (`num_completions_to_print`), writes to `output_dir/completions/` and sends to the trackers as a table. The
    rewards' `log_extra` columns follow the trainer's own extra columns (None in a row without a value)."""
    names = list(rows[0]["rewards"]) if rows else []
    logged = list(dict.fromkeys(column for row in rows for column in row.get("log_extra", {})))
    return {
        "images": deque(),
        "prompt": deque(row["prompt"] for row in rows),
        "completion": deque(row["completion"] for row in rows),
        "rewards": {name: deque(row["rewards"][name] for row in rows) for name in names},
        "advantages": deque(row["advantage"] for row in rows),
        "extra": {
            column: deque(row[column] for row in rows)
            for column in ("agent", "turn", "tool_calls")
            if column != "tool_calls" or any("tool_calls" in row for row in rows)
        }
        | {column: deque(row.get("log_extra", {}).get(column) for row in rows) for column in logged},
    }
