"""A step's tree in W&B, where TRL logs its completions table: a `wandb.Table` with one row per joint action and a
`parent` column (the joint action it continues), so that W&B's own table view can sort by return, filter a turn or a
prompt, and follow a branch back to its root. (A `wandb.Html` page was the alternative: W&B shows it in a sandboxed
frame, without its sorting and filtering, and cannot compare it across steps; the HTML page is `python -m
trl_multiagent.view`'s job, on the run folder.)"""

from __future__ import annotations


TABLE_KEY = "rollout_tree"


def tree_table_rows(document: dict) -> tuple[list[str], list[list]]:
    """The columns and rows of a step's document (`record.tree_records`' layout, gathered)."""
    num_agents, names = document["num_agents"], document["reward_names"]
    columns = ["step", "prompt", "id", "parent", "turn", "node", "action", "terminated", "pruned"]
    columns += [f"agent_{i}/{field}" for i in range(num_agents) for field in ("prompt", "completion", "advantage")]
    columns += ["reward", *(f"rewards/{name}" for name in names), "return"]
    rows = []
    for prompt in document["prompts"]:
        label = f"{prompt['process']}:{prompt['row']}"
        nodes = prompt["nodes"]
        for node in nodes:
            parent = node["parent"]
            parent_id = f"{label}/{parent['node']}.{parent['action']}" if parent else ""
            for j, action in enumerate(node["actions"]):
                row = [document["step"], label, f"{label}/{node['id']}.{j}", parent_id, node["turn"], node["id"], j]
                row += [node["terminated"], action["pruned"]]
                for i, agent in enumerate(node["agents"]):
                    completion = agent["completions"][action["choice"][i]]
                    row += [agent["prompt"], completion["text"], completion["advantage"]]
                row += [action["reward"], *(action["rewards"].get(name) for name in names), action["return"]]
                rows.append(row)
    return columns, rows


def log_tree_table(document: dict) -> bool:
    """Log the step's table to the active W&B run (committed with the step's metrics, which the Trainer logs next).
    Returns whether it was logged: not without wandb or a run, as TRL's completions table."""
    try:
        import wandb
    except ImportError:
        return False
    if wandb.run is None:
        return False
    columns, rows = tree_table_rows(document)
    wandb.log({TABLE_KEY: wandb.Table(columns=columns, data=rows)}, commit=False)
    return True
