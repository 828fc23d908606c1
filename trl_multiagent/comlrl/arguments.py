"""CoMLRL 1.4.3's trainer arguments that the TRL face lacks, in TRL's terms: `agent_model` beside `agents`,
`model_config` (`model_init_kwargs` and added tokens), `wandb_config` (TRL's wandb reporting). CoMLRL's `eval_logger`
and `eval_aggregator` belong to its evaluation (`comlrl.evaluation`)."""

from __future__ import annotations

from transformers import TrainerCallback


MODEL_CONFIG_KEYS = ("torch_dtype", "dtype", "attn_implementation", "model_kwargs", "special_tokens")
# wandb_config keys CoMLRL 1.4.3 passes to `wandb.init` under the same name; `name`/`run_name`, `tags` and
# `config_sections` are handled apart.
WANDB_INIT_KEYS = ("project", "entity", "dir", "mode", "id", "resume")
WANDB_KEYS = (*WANDB_INIT_KEYS, "name", "run_name", "tags", "config_sections")


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
    """CoMLRL's `wandb_config` as TRL's: `report_to="wandb"`, `run_name`, and the callback that opens the run as
    CoMLRL does (`WandbRun`). No `WANDB_*` variable is set: the process's environment is the user's."""
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
    init = {key: wandb_config[key] for key in WANDB_INIT_KEYS if wandb_config.get(key)}
    init.update(
        {"name": name} if name else {}, **({"tags": list(wandb_config["tags"])} if wandb_config.get("tags") else {})
    )
    sections = wandb_config.get("config_sections")
    sections = sections if isinstance(sections, dict) else {}
    output = sections.get("output")
    if isinstance(output, dict) and output.get("verbose") is False:
        args.disable_tqdm = True  # CoMLRL's `config_sections.output.verbose=False` turns its progress bars off
    return [WandbRun(init, sections)]


class WandbRun(TrainerCallback):
    """Opens the wandb run when the trainer is built, on the main process, as CoMLRL's trainer does: `wandb.init` with
    `wandb_config`'s project, entity, dir, mode, id, resume, name and tags, and its `config_sections` as the run's
    config (`dataset.name`/`dataset.type` also as `dataset_name`/`dataset_type`). The Trainer's `WandbCallback` then
    logs into that run instead of opening one. A run already open is kept when `wandb_config` names no other `id`."""

    def __init__(self, init_kwargs: dict, sections: dict):
        self.init_kwargs = init_kwargs
        self.sections = dict(sections)
        dataset = sections.get("dataset")
        if isinstance(dataset, dict):
            self.sections.update({f"dataset_{k}": dataset[k] for k in ("name", "type") if k in dataset})

    def on_init_end(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        import wandb

        run = wandb.run
        if run is None or self.init_kwargs.get("id", run.id) != run.id:
            wandb.init(**self.init_kwargs, config=self.sections)
        else:
            run.config.update(self.sections, allow_val_change=True)
