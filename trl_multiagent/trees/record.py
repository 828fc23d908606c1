"""One process's rollout tree as plain records: per prompt, its nodes with every agent's texts, token counts, tool
calls, each reward function's value, the joint reward, the return and each completion's advantage. No collectives, no
files: `store.TreeRecorder` gathers the records of every process and writes them.

The layout (``FORMAT_VERSION`` 1), one record per prompt (dataset row of the rollout batch)::

    {"process": 0, "row": 0, "nodes": [
        {"id": 0, "turn": 1, "parent": null | {"node": 0, "action": 2}, "terminated": false,
         "agents": [{"prompt": "...", "prompt_tokens": 31, "completions": [
             {"text": "...", "tokens": 24, "truncated": true, "advantage": 0.7, "return": 1.4,
              "tool_calls": 1, "tool_failures": 0, "messages": [...]}]}],      # tools only
         "actions": [{"choice": [0, 0], "reward": 0.8, "rewards": {"f": 0.8}, "return": 1.4, "pruned": false,
                      "child": 1 | null, "own_rewards": [...], "extra": {...}}]}]}

Node ids are positions in the prompt's own `nodes` list; `parent.action` is the index of the joint action (in its
parent's `actions`) that the node continues. A text longer than `max_chars` keeps its first and last halves with the
marker ``…[N characters cut]…`` between them (`clip`): the task and the newest feedback both stay visible.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any


if TYPE_CHECKING:  # only annotations: the viewer imports this package without torch
    import torch


FORMAT_VERSION = 1
CUT_MARKER = "…[{} characters cut]…"


def clip(text: str, max_chars: int) -> str:
    """`text`, or its first and last `max_chars // 2` characters around a marker saying how many were cut.

    >>> clip("abcdefghij", 4)
    'ab…[6 characters cut]…ij'
    >>> clip("short", 10)
    'short'
    """
    if len(text) <= max_chars:
        return text
    half = max_chars // 2
    return text[:half] + CUT_MARKER.format(len(text) - 2 * half) + text[len(text) - half :]


def prompt_text(prompt) -> str:
    """A prompt as text: as it is, or chat messages as ``role: content`` lines."""
    if isinstance(prompt, str):
        return prompt
    lines = []
    for message in prompt:
        content = message.get("content", "")
        if not isinstance(content, str):  # multimodal parts: their text
            content = " ".join(part.get("text", "") for part in content if isinstance(part, dict))
        lines.append(f"{message.get('role', '?')}: {content}")
    return "\n".join(lines)


def _number(value) -> float | None:
    """A JSON number, or None (NaN and inf are not JSON)."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _json_safe(value, max_chars: int):
    """A `log_extra` value or a tool message as JSON, long strings clipped, anything else as its clipped repr."""
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, float):
        return _number(value)
    if isinstance(value, str):
        return clip(value, max_chars)
    if isinstance(value, dict):
        return {str(k): _json_safe(v, max_chars) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v, max_chars) for v in value]
    try:
        json.dumps(value)
        return value
    except TypeError:
        return clip(repr(value), max_chars)


def tree_records(
    tree,
    returns: list[float],
    credited: torch.Tensor,
    advantages: torch.Tensor,
    task_record,
    *,
    max_completion_length: int,
    max_chars: int,
    process_index: int = 0,
) -> list[dict[str, Any]]:
    """The records of one process's tree (`rollout.RolloutTree`), one per prompt.

    `returns` is the team's return of each joint action (`credit.assign`); `credited` and `advantages`, of shape
    ``(nodes, agents, K)``, are each completion's credited return and the advantage the update uses. `task_record` is
    the generation's `rollout.task.TaskRecord`: each joint action's value of each reward function
    (`action_rewards`) and the rewards' `log_extra` columns. A completion is `truncated` when the model wrote
    `max_completion_length` tokens (it was cut there, as `completions/clipped_ratio` counts it).
    """
    names = list(task_record.reward_names)
    by_row: dict[int, list[int]] = {}
    for n, node in enumerate(tree.nodes):
        by_row.setdefault(node.row, []).append(n)
    records = []
    for row, node_ids in by_row.items():
        local = {n: j for j, n in enumerate(node_ids)}
        records.append(
            {
                "process": process_index,
                "row": row,
                "nodes": [
                    _node_record(
                        tree,
                        n,
                        local,
                        returns,
                        credited,
                        advantages,
                        task_record,
                        names,
                        max_completion_length,
                        max_chars,
                    )
                    for n in node_ids
                ],
            }
        )
    return records


def _node_record(tree, n, local, returns, credited, advantages, task_record, names, max_length, max_chars) -> dict:
    node = tree.nodes[n]
    parent = None
    if node.parent is not None:
        action = tree.joint_actions[node.parent]
        parent = {"node": local[action.node], "action": tree.nodes[action.node].joint_actions.index(node.parent)}
    agents = []
    for i, completions in enumerate(node.completions):
        rows = []
        for k, text in enumerate(completions):
            ids = node.completion_ids[i][k]
            model_tokens = sum(node.tool_masks[i][k]) if node.tool_masks else len(ids)
            completion = {
                "text": clip(text, max_chars),
                "tokens": model_tokens,
                "truncated": model_tokens >= max_length,
                "advantage": _number(advantages[n, i, k]),
                "return": _number(credited[n, i, k]),
            }
            if node.own_prompts is not None:  # the completion's own first prompt (its world's observation)
                completion["prompt"] = clip(prompt_text(node.own_prompts[i][k]), max_chars)
                completion["prompt_tokens"] = len(node.prompt_ids[i][k])
            if node.tool_calls:
                completion["tool_calls"] = node.tool_calls[i][k]
                completion["tool_failures"] = node.tool_failures[i][k]
                messages = node.messages[i][k] if node.messages else None
                if messages:
                    completion["messages"] = _json_safe(messages, max_chars)
            rows.append(completion)
        agents.append(
            {
                "prompt": clip(prompt_text(node.prompts[i]), max_chars),
                "prompt_tokens": len(node.prompt_ids[i][0]) if node.prompt_ids and node.own_prompts is None else None,
                "completions": rows,
            }
        )
    actions = []
    for a in node.joint_actions:
        action = tree.joint_actions[a]
        values = task_record.action_rewards.get(a, (None,) * len(names))
        record = {
            "choice": list(action.choice),
            "reward": _number(action.reward),
            "rewards": {name: _number(v) for name, v in zip(names, values, strict=True)},
            "return": _number(returns[a]),
            "pruned": action.pruned,
            "child": local.get(action.child) if action.child is not None else None,
        }
        if action.own_rewards is not None:
            record["own_rewards"] = [_number(v) for v in action.own_rewards]
        extra = {
            column: _json_safe(
                values.get((a, None), [values.get((a, i)) for i in range(len(node.completions))]), max_chars
            )
            for column, values in task_record.extra_columns.items()
            if (a, None) in values or any((a, i) in values for i in range(len(node.completions)))
        }
        if extra:
            record["extra"] = extra
        actions.append(record)
    return {
        "id": local[n],
        "turn": node.turn,
        "parent": parent,
        "terminated": node.terminated,
        "agents": agents,
        "actions": actions,
    }
