"""CoMLRL 1.4.3's trainer arguments that the TRL face lacks, in TRL's terms: `agent_model` beside `agents`,
`model_config` (`model_init_kwargs` and added tokens), `wandb_config` (TRL's wandb reporting), `eval_logger` and
`eval_aggregator` (metrics of each evaluation rollout)."""

from __future__ import annotations

import os
from collections.abc import Callable

from transformers import TrainerCallback


MODEL_CONFIG_KEYS = ("torch_dtype", "dtype", "attn_implementation", "model_kwargs", "special_tokens")
# wandb_config keys CoMLRL 1.4.3 reads, and the environment variable each becomes (transformers' WandbCallback and
# wandb read them); `name`/`run_name`, `tags` and `config_sections` are handled apart.
WANDB_ENVIRONMENT = {
    "project": "WANDB_PROJECT",
    "entity": "WANDB_ENTITY",
    "dir": "WANDB_DIR",
    "mode": "WANDB_MODE",
    "id": "WANDB_RUN_ID",
    "resume": "WANDB_RESUME",
}
WANDB_KEYS = (*WANDB_ENVIRONMENT, "name", "run_name", "tags", "config_sections")


def check_agent_model_names(agent_model, agents) -> None:
    """CoMLRL 1.4.3 takes `agent_model` beside `agents` when every agent is that model (by id, or by its config's
    `_name_or_path`); the agents are then used as given."""
    for i, agent in enumerate(agents):
        name = agent if isinstance(agent, str) else getattr(getattr(agent, "config", None), "_name_or_path", None)
        if name != agent_model:
            raise ValueError(
                f"MAGRPOTrainer: agent_model={agent_model!r} conflicts with agents[{i}] ({name!r}); CoMLRL takes both "
                "only when every agent is that model. Pass one of them."
            )


def model_config_keywords(model_config: dict, args) -> dict | None:
    """`model_config`'s loading keywords into `args.model_init_kwargs`; returns its `special_tokens`."""
    unknown = sorted(set(model_config) - set(MODEL_CONFIG_KEYS))
    if unknown:
        raise ValueError(
            f"MAGRPOTrainer: model_config keys {unknown} (CoMLRL) have no equivalent here; it takes "
            f"{list(MODEL_CONFIG_KEYS)}."
        )
    kwargs = dict(model_config.get("model_kwargs") or {})
    for key in ("torch_dtype", "dtype", "attn_implementation"):
        if model_config.get(key) is not None:
            kwargs["dtype" if key == "torch_dtype" else key] = model_config[key]
    args.model_init_kwargs = {**(args.model_init_kwargs or {}), **kwargs}
    return model_config.get("special_tokens") or None


def add_special_tokens(tokenizers: list, special_tokens: dict | None) -> None:
    """CoMLRL's `model_config["special_tokens"]`: `tokenizer.add_special_tokens(...)` on every agent's tokenizer
    (`assembly.build_team(resize_embeddings=True)` then grows each agent's embeddings to its tokenizer)."""
    if not special_tokens:
        return
    for tokenizer in {id(t): t for t in tokenizers}.values():
        tokenizer.add_special_tokens(special_tokens)


def wandb_reporting(wandb_config: dict, args) -> list:
    """CoMLRL's `wandb_config` as TRL's: `report_to="wandb"`, `run_name`, the `WANDB_*` variables wandb reads, and
    `config_sections` merged into the run's config (returns the callback that does it)."""
    unknown = sorted(set(wandb_config) - set(WANDB_KEYS))
    if unknown:
        raise ValueError(
            f"MAGRPOTrainer: wandb_config keys {unknown} have no equivalent here; it takes {list(WANDB_KEYS)} (set "
            "other wandb settings with WANDB_* environment variables)."
        )
    if "wandb" not in (args.report_to or []):
        args.report_to = [*(t for t in (args.report_to or []) if t != "none"), "wandb"]
    name = wandb_config.get("name") or wandb_config.get("run_name")
    if name:
        args.run_name = name
    for key, variable in WANDB_ENVIRONMENT.items():
        if wandb_config.get(key):
            os.environ[variable] = str(wandb_config[key])
    if wandb_config.get("tags"):
        os.environ["WANDB_TAGS"] = ",".join(wandb_config["tags"])
    sections = wandb_config.get("config_sections")
    if not isinstance(sections, dict) or not sections:
        return []
    output = sections.get("output")
    if isinstance(output, dict) and output.get("verbose") is False:
        args.disable_tqdm = True  # CoMLRL's `config_sections.output.verbose=False` turns its progress bars off
    return [WandbConfigSections(sections)]


class WandbConfigSections(TrainerCallback):
    """Adds CoMLRL's `wandb_config["config_sections"]` to the wandb run's config once the run exists, as CoMLRL's
    `wandb.init(config=...)` does (`dataset.name`/`dataset.type` also as `dataset_name`/`dataset_type`)."""

    def __init__(self, sections: dict):
        self.sections = dict(sections)
        dataset = sections.get("dataset")
        if isinstance(dataset, dict):
            self.sections.update({f"dataset_{k}": dataset[k] for k in ("name", "type") if k in dataset})

    def on_train_begin(self, args, state, control, **kwargs):
        import wandb

        if state.is_world_process_zero and wandb.run is not None:
            wandb.run.config.update(self.sections, allow_val_change=True)


class Evaluation:
    """CoMLRL's `eval_logger` and `eval_aggregator`, called as CoMLRL calls them on each evaluation batch:
    ``eval_logger(agent_completions_turns=[agent][item][turn], batch_items=rows, prompts=[row prompt])``, then
    ``eval_aggregator(its result, num_turns=T)``, whose dict is logged as `eval_{key}` (CoMLRL: `eval/{key}`).

    An item's path is CoMLRL's: one answer per agent per turn, here the first joint answer of each node and the
    branch it leads to.
    """

    def __init__(self, eval_logger: Callable, eval_aggregator: Callable):
        self.eval_logger, self.eval_aggregator = eval_logger, eval_aggregator

    @classmethod
    def from_arguments(cls, eval_logger, eval_aggregator) -> Evaluation | None:
        for name, func in (("eval_logger", eval_logger), ("eval_aggregator", eval_aggregator)):
            if func is not None and not callable(func):
                raise TypeError(f"MAGRPOTrainer: {name} must be callable, got {func!r}.")
        if (eval_logger is None) != (eval_aggregator is None):
            given = "eval_logger" if eval_logger is not None else "eval_aggregator"
            raise ValueError(
                f"MAGRPOTrainer: {given} is given alone; CoMLRL calls eval_logger and eval_aggregator together (the "
                "aggregator turns the logger's per-item metrics into the logged values). Pass both."
            )
        return None if eval_logger is None else cls(eval_logger, eval_aggregator)

    def __call__(self, tree, rows: list[dict], num_turns: int) -> dict[str, float]:
        completions = [first_paths(tree, len(rows), agent) for agent in range(len(tree.nodes[0].completions))]
        detailed = self.eval_logger(
            agent_completions_turns=completions, batch_items=rows, prompts=[row.get("prompt", "") for row in rows]
        )
        aggregated = self.eval_aggregator(detailed, num_turns=num_turns)
        if not isinstance(aggregated, dict):
            raise TypeError(f"MAGRPOTrainer: eval_aggregator must return a dict of metrics, got {aggregated!r}.")
        return {str(key): float(value) for key, value in aggregated.items()}


def first_paths(tree, num_rows: int, agent: int) -> list[list[str]]:
    """Per dataset row, `agent`'s answer at each turn along the first joint answer of every node."""
    paths = []
    for row in range(num_rows):
        node = next(n for n in tree.nodes if n.row == row and n.parent is None)
        path = []
        while node is not None:
            action = tree.joint_actions[node.joint_actions[0]]
            path.append(node.completions[agent][action.choice[agent]])
            node = tree.nodes[action.child] if action.child is not None else None
        paths.append(path)
    return paths
