"""CoMLRL 1.4.3's MAGRPO names, and what each becomes here. One table for the config, one for the trainer.

A CoMLRL script runs with its import changed (``from trl_multiagent import MAGRPOConfig, MAGRPOTrainer``):
`MAGRPOConfig.__init__` and `MAGRPOTrainer.__init__` pass the CoMLRL-only keywords through `config_keywords` and
`trainer_arguments` below. A name that maps is translated (and said once, in the log, when the unit or the meaning
shifts); a name with no equivalent is refused before anything is loaded, with what to write instead. The names stay
out of the dataclass, so TRL's command-line parser and `TrainingArguments`' own properties (`train_batch_size`,
`eval_batch_size`) are untouched.

Fields with the same name and meaning in both (`num_train_epochs`, `logging_steps`, `num_generations`,
`max_new_tokens`, `temperature`, `top_p`, `top_k`, `num_turns`, `discount`, `joint_mode`,
`early_termination_threshold`) need nothing. Their *defaults* are TRL's here, not CoMLRL's.
"""

from __future__ import annotations

import copy
import inspect
import os
from typing import Any

from transformers.utils import logging


logger = logging.get_logger(__name__)

LAUNCH = (
    "one process per device with `accelerate launch --config_file accelerate_configs/multi_gpu.yaml` (or zero2.yaml, "
    "zero3.yaml for DeepSpeed); every process holds the whole team, DeepSpeed ZeRO shards it"
)
ADVANTAGE_MODES = {"mean": "mean", "rloo": "rloo", "max": "max", "raw": "none"}

# CoMLRL config fields that MAGRPOConfig refuses unless they hold CoMLRL's "nothing to do" value.
REFUSED_CONFIG_FIELDS = {
    "parallel_training": ("none", f"parallel_training places agents on devices in CoMLRL; here, use {LAUNCH}"),
    "agent_devices": (None, f"agent_devices places agents on devices in CoMLRL; here, use {LAUNCH}"),
    "reference_devices": (None, f"reference_devices places the KL references in CoMLRL; here, use {LAUNCH}"),
    "rollout_buffer_size": (
        None,
        "CoMLRL updates from a buffer of tree nodes; here each optimizer step takes the whole trees of "
        "per_device_train_batch_size * steps_per_generation / num_generations prompts per process: set "
        "per_device_train_batch_size (rows, K per prompt) and gradient_accumulation_steps instead",
    ),
    "train_batch_size": (
        None,
        "CoMLRL's train_batch_size counts buffered tree nodes per update; here the update takes whole trees (see "
        "per_device_train_batch_size), and update_chunk_size bounds the rows of one forward/backward",
    ),
}


def _default(name: str, kwargs: dict, config_class) -> Any:
    return kwargs[name] if name in kwargs else config_class.__dataclass_fields__[name].default


def config_keywords(kwargs: dict, config_class) -> tuple[dict, dict]:
    """Split `MAGRPOConfig(**kwargs)` into the keywords of the dataclass and the CoMLRL settings the trainer reads.

    Returns ``(dataclass keywords, settings for the trainer)``: the settings hold `num_agents`, `eval_num_samples`,
    `eval_interval` and `external_prompt_passthrough` when given. Refuses what has no equivalent.
    """
    kwargs, settings = dict(kwargs), {}
    for name, (inert, instead) in REFUSED_CONFIG_FIELDS.items():
        if name in kwargs:
            value = kwargs.pop(name)
            if value != inert:
                raise ValueError(
                    f"MAGRPOConfig: {name}={value!r} is a CoMLRL field with no equivalent here: {instead}."
                )
    if "external_prompt_passthrough" in kwargs:
        settings["external_prompt_passthrough"] = bool(kwargs.pop("external_prompt_passthrough"))
    if "agent_learning_rate" in kwargs:
        _take(kwargs, "agent_learning_rate", "learning_rate")
    if "num_agents" in kwargs:
        settings["num_agents"] = int(kwargs.pop("num_agents"))
    if "advantage_mode" in kwargs:
        mode = str(kwargs.pop("advantage_mode")).lower()
        if mode not in ADVANTAGE_MODES:
            raise ValueError(
                f"MAGRPOConfig: advantage_mode={mode!r} (CoMLRL) must be one of {list(ADVANTAGE_MODES)}; here it is "
                "advantage_baseline, one of 'mean', 'rloo', 'max', 'none'."
            )
        _put(kwargs, "advantage_baseline", ADVANTAGE_MODES[mode], "advantage_mode")
    if "advantage_normalization" in kwargs:
        normalise = bool(kwargs.pop("advantage_normalization"))
        _put(kwargs, "scale_rewards", "group" if normalise else "none", "advantage_normalization")
        if normalise:
            logger.info_once(
                "MAGRPOConfig: advantage_normalization=True (CoMLRL) -> scale_rewards='group': each group's "
                "advantages are divided by the group's std (TRL's GRPO), after the baseline."
            )
    enabled, coef = kwargs.pop("reference_kl_enabled", None), kwargs.pop("reference_kl_coef", None)
    if enabled:
        _put(kwargs, "beta", 0.1 if coef is None else float(coef), "reference_kl_enabled")
        logger.info_once(
            f"MAGRPOConfig: reference_kl_enabled=True (CoMLRL) -> beta={kwargs['beta']}: TRL's KL term in the loss, "
            "against each agent's frozen copy (CoMLRL subtracts it from the returns instead)."
        )
    elif enabled is not None or coef is not None:
        _put(kwargs, "beta", 0.0, "reference_kl_enabled")
    k = _default("num_generations", kwargs, config_class)
    if "eval_batch_size" in kwargs:
        prompts = int(kwargs.pop("eval_batch_size"))
        _put(kwargs, "per_device_eval_batch_size", prompts * k, "eval_batch_size")
        logger.info_once(
            f"MAGRPOConfig: eval_batch_size={prompts} (CoMLRL, prompts) -> per_device_eval_batch_size={prompts * k} "
            "(rows: prompts x num_generations, as in TRL)."
        )
    if "eval_num_samples" in kwargs:
        settings["eval_num_samples"] = int(kwargs.pop("eval_num_samples"))
    if "eval_interval" in kwargs:
        settings["eval_interval"] = int(kwargs.pop("eval_interval"))
        _eval_interval(kwargs, settings["eval_interval"], k, config_class)
    return kwargs, settings


def _take(kwargs: dict, comlrl_name: str, name: str) -> None:
    _put(kwargs, name, kwargs.pop(comlrl_name), comlrl_name)


def _put(kwargs: dict, name: str, value, comlrl_name: str) -> None:
    if name in kwargs and kwargs[name] != value:
        raise ValueError(
            f"MAGRPOConfig: {comlrl_name} (CoMLRL) sets {name}={value!r}, but {name}={kwargs[name]!r} is also given. "
            "Pass one of them."
        )
    kwargs[name] = value


def _eval_interval(kwargs: dict, interval: int, k: int, config_class) -> None:
    """CoMLRL evaluates every `interval` one-prompt steps, from the first; a step here takes several prompts."""
    if interval <= 0:
        _put(kwargs, "eval_strategy", "no", "eval_interval")
        return
    rows = _default("per_device_train_batch_size", kwargs, config_class)
    rows *= _default("gradient_accumulation_steps", kwargs, config_class)
    prompts = max(rows * int(os.environ.get("WORLD_SIZE", "1")) // k, 1)
    steps = max(round(interval / prompts), 1)
    _put(kwargs, "eval_strategy", "steps", "eval_interval")
    _put(kwargs, "eval_steps", steps, "eval_interval")
    kwargs.setdefault("eval_on_start", True)  # CoMLRL evaluates before its first step too
    logger.info_once(
        f"MAGRPOConfig: eval_interval={interval} (CoMLRL, one-prompt steps) -> eval_strategy='steps', "
        f"eval_steps={steps} (a step here takes {prompts} prompts), eval_on_start=True."
    )


def formats_later_turns(formatters, args) -> bool:
    """CoMLRL formats every later turn's prompt too, with `formatter(row, external_prompts=prompt)`, unless
    `external_prompt_passthrough=True`. Here that applies when every formatter takes `external_prompts` (CoMLRL's
    multi-turn formatters do; they would fail in CoMLRL otherwise); other formatters shape the first turn only."""
    if formatters is None or args.comlrl_settings.get("external_prompt_passthrough", False):
        return False
    return all("external_prompts" in inspect.signature(f).parameters for f in formatters)


def format_later_turn(formatters, row: dict, prompts: list) -> list:
    """Each agent's next prompt as CoMLRL writes it: its formatter on the row whose `prompt` is the transition's."""
    return [f({**row, "prompt": p}, external_prompts=p) for f, p in zip(formatters, prompts, strict=True)]


# CoMLRL MAGRPOTrainer arguments with no equivalent here.
REFUSED_TRAINER_ARGUMENTS = {
    "eval_logger": (
        "evaluation logs eval_turn_{t}/reward_mean, eval_turn_{t}/expected_return and TRL's eval_ metrics; for "
        "metrics of your own, compute them in the reward function (its per-function means are logged as "
        "turn_{t}/rewards/{name}/mean) or in a TrainerCallback's on_evaluate"
    ),
    "eval_aggregator": "see eval_logger: evaluation metrics are aggregated like training ones, per turn",
}
MODEL_CONFIG_KEYS = ("torch_dtype", "dtype", "attn_implementation", "model_kwargs")


def trainer_arguments(kwargs: dict, args, *, agents, model, num_agents, formatters, eval_dataset) -> dict:
    """Translate `MAGRPOTrainer(**kwargs)`'s CoMLRL-only keywords into its own.

    `agent_model` is `model`, copied `num_agents` times (the trainer's, else `MAGRPOConfig(num_agents=)`, else 2 as
    in CoMLRL); one callable as `formatters` serves every agent; `model_config`'s dtype and attention become
    `args.model_init_kwargs`; `wandb_config` becomes `report_to="wandb"`, `run_name` and `WANDB_*`; the config's
    `eval_num_samples` keeps that many rows of `eval_dataset`, and its `eval_interval` evaluates only when there is
    an `eval_dataset` (as in CoMLRL).

    Returns:
        The trainer's ``args`` (a copy of the given config when these keywords change it), ``model``,
        ``num_agents``, ``formatters``, ``reward_processor`` and ``eval_dataset``.
    """
    kwargs = dict(kwargs)
    for name, instead in REFUSED_TRAINER_ARGUMENTS.items():
        if kwargs.pop(name, None) is not None:
            raise ValueError(f"MAGRPOTrainer: {name} is a CoMLRL argument with no equivalent here: {instead}.")
    agent_model = kwargs.pop("agent_model", None)
    if agent_model is not None:
        if model is not None:
            raise ValueError("MAGRPOTrainer: pass `model` or `agent_model` (CoMLRL's name), not both.")
        model = agent_model
    configured = args.comlrl_settings.get("num_agents")
    if num_agents is not None and configured is not None and num_agents != configured:
        raise ValueError(f"MAGRPOTrainer: num_agents={num_agents}, but MAGRPOConfig(num_agents={configured}).")
    if agents is not None and configured is not None and len(agents) != configured:
        raise ValueError(
            f"MAGRPOTrainer got {len(agents)} agents, but MAGRPOConfig(num_agents={configured}); pass {configured} "
            "agents, or leave num_agents out (the team's size is the number of agents given)."
        )
    if num_agents is None and agents is None and model is not None:
        num_agents = configured if configured is not None else 2 if agent_model is not None else None
    if callable(formatters):
        formatters = [formatters] * (len(agents) if agents is not None else num_agents or 1)
    reward_processor = kwargs.pop("reward_processor", None)
    if reward_processor is not None and not callable(reward_processor):
        raise TypeError(
            f"MAGRPOTrainer: reward_processor must be a callable float -> float, got {reward_processor!r}."
        )
    model_config = kwargs.pop("model_config", None)
    wandb_config = kwargs.pop("wandb_config", None)
    if kwargs:
        raise TypeError(f"MAGRPOTrainer got unexpected keyword arguments {sorted(kwargs)}.")
    no_evaluation = "eval_interval" in args.comlrl_settings and eval_dataset is None
    if model_config or wandb_config or no_evaluation:
        args = copy.copy(args)  # the caller's config stays as it was: it may build another trainer
    if model_config:
        _model_config(model_config, args)
    if wandb_config:
        _wandb_config(wandb_config, args)
    samples = args.comlrl_settings.get("eval_num_samples")
    if samples is not None and eval_dataset is not None and samples < len(eval_dataset):
        eval_dataset = eval_dataset.select(range(samples))
    if no_evaluation:
        args.eval_strategy, args.eval_on_start = "no", False
    return {"args": args, "model": model, "num_agents": num_agents, "formatters": formatters,
            "reward_processor": reward_processor, "eval_dataset": eval_dataset}  # fmt: skip


def _model_config(model_config: dict, args) -> None:
    unknown = sorted(set(model_config) - set(MODEL_CONFIG_KEYS))
    if unknown:
        raise ValueError(
            f"MAGRPOTrainer: model_config keys {unknown} (CoMLRL) have no equivalent here; it takes "
            f"{list(MODEL_CONFIG_KEYS)} (as MAGRPOConfig.model_init_kwargs). Add special tokens to your tokenizer, and "
            "resize the model's embeddings, before building the trainer."
        )
    kwargs = dict(model_config.get("model_kwargs") or {})
    for key in ("torch_dtype", "dtype", "attn_implementation"):
        if model_config.get(key) is not None:
            kwargs["dtype" if key == "torch_dtype" else key] = model_config[key]
    args.model_init_kwargs = {**(args.model_init_kwargs or {}), **kwargs}


WANDB_ENVIRONMENT = {"project": "WANDB_PROJECT", "entity": "WANDB_ENTITY", "dir": "WANDB_DIR", "mode": "WANDB_MODE"}


def _wandb_config(wandb_config: dict, args) -> None:
    """CoMLRL's `wandb_config` as TRL's: `report_to="wandb"`, `run_name`, and the `WANDB_*` variables wandb reads."""
    unknown = sorted(set(wandb_config) - {"name", "tags", *WANDB_ENVIRONMENT})
    if unknown:
        raise ValueError(
            f"MAGRPOTrainer: wandb_config keys {unknown} have no equivalent here; it takes name, tags and "
            f"{sorted(WANDB_ENVIRONMENT)} (set other wandb settings with WANDB_* environment variables)."
        )
    if "wandb" not in (args.report_to or []):
        args.report_to = [*(t for t in (args.report_to or []) if t != "none"), "wandb"]
    if wandb_config.get("name"):
        args.run_name = wandb_config["name"]
    for key, variable in WANDB_ENVIRONMENT.items():
        if wandb_config.get(key):
            os.environ[variable] = str(wandb_config[key])
    if wandb_config.get("tags"):
        os.environ["WANDB_TAGS"] = ",".join(wandb_config["tags"])
