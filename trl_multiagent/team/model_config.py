"""TRL's `ModelConfig` flags for a team: what `--model_name_or_path`, `--dtype`, `--attn_implementation` and
`--use_peft --lora_r 16 --lora_target_modules all-linear` mean to `MAGRPOTrainer`, as they mean it to TRL's `grpo.py`.

A recipe parses `ModelConfig` beside its `MAGRPOConfig` with `TrlParser`, and passes `team_from_model_config(...)` to
the trainer:

    parser = TrlParser((ScriptArguments, MAGRPOConfig, ModelConfig))
    script_args, training_args, model_args = parser.parse_args_and_config()
    trainer = MAGRPOTrainer(**team_from_model_config(model_args, 2, training_args), reward_funcs=..., ...)
"""

from __future__ import annotations

from typing import Any

import torch
from trl import ModelConfig, get_peft_config, get_quantization_config


def team_from_model_config(model_args: ModelConfig, num_agents: int, training_args) -> dict[str, Any]:
    """`MAGRPOTrainer` keyword arguments for a team of `num_agents` agents of `model_args.model_name_or_path`.

    As TRL's `grpo.py`: the model is loaded with `model_init_kwargs` from `--model_revision`, `--trust_remote_code`,
    `--attn_implementation`, `--dtype` (and `--load_in_4bit`/`--load_in_8bit`), which this writes into
    `training_args.model_init_kwargs` under any the user set there. `--use_peft` gives the shared-base LoRA team: one
    base, one adapter per agent, built from `get_peft_config(model_args)`; without it, each agent is a full copy.

    >>> from trl_multiagent import MAGRPOConfig
    >>> args = MAGRPOConfig(output_dir="/tmp/doctest_model_config", report_to="none")
    >>> model_args = ModelConfig(model_name_or_path="my/model", dtype="bfloat16", use_peft=True, lora_r=16,
    ...                          lora_target_modules=["all-linear"])
    >>> team = team_from_model_config(model_args, 2, args)
    >>> team["model"], team["num_agents"], team["peft_config"].r, team["peft_config"].target_modules
    ('my/model', 2, 16, 'all-linear')
    >>> args.model_init_kwargs["dtype"]
    torch.bfloat16
    >>> team_from_model_config(ModelConfig(model_name_or_path="my/model"), 3, args)["peft_config"] is None
    True
    """
    if not model_args.model_name_or_path:
        raise ValueError("team_from_model_config: `model_args.model_name_or_path` is empty; name a model or folder.")
    dtype = model_args.dtype
    if dtype not in (None, "auto"):
        dtype = getattr(torch, dtype)
    model_init_kwargs = dict(
        revision=model_args.model_revision,
        trust_remote_code=training_args.trust_remote_code,
        attn_implementation=model_args.attn_implementation,
        dtype=dtype,
    )
    quantization_config = get_quantization_config(model_args)
    if quantization_config is not None:
        model_init_kwargs["quantization_config"] = quantization_config
    training_args.model_init_kwargs = {**model_init_kwargs, **(training_args.model_init_kwargs or {})}
    return {
        "model": model_args.model_name_or_path,
        "num_agents": num_agents,
        "peft_config": get_peft_config(model_args),
    }
