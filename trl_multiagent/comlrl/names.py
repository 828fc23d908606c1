"""CoMLRL 1.4.3's names that the TRL face (`trl_multiagent.MAGRPOConfig`, `MAGRPOTrainer`) refuses, each with what it is
in TRL's terms (`NAMES`): the package's `__init__` registers this table with `keywords`, whose message of that refusal
gives it and points to this face."""

from __future__ import annotations

from ..keywords import FaceNames


CONFIG = {
    "agent_learning_rate": "`learning_rate`",
    "parallel_training": "none: each process holds the whole team; several devices are several processes "
    "(`accelerate launch`)",
    "agent_devices": "none: each process trains on its own device (`accelerate launch`)",
    "reference_devices": "none: each agent's reference lives beside it",
    "external_prompt_passthrough": "the default: the transition's prompts are used as they are",
    "eval_interval": "`eval_strategy='steps'` with `eval_steps`",
    "eval_num_samples": "an `eval_dataset` of that many rows",
    "eval_batch_size": "`per_device_eval_batch_size` (rows: prompts x num_generations)",
    "rollout_buffer_size": "`per_device_train_batch_size` with `steps_per_generation`",
    "train_batch_size": "`per_device_train_batch_size` (rows: prompts x num_generations)",
    "advantage_normalization": "`scale_rewards` ('group_zscore', or 'none' for False)",
    "advantage_mode": "`advantage_baseline` (mean, rloo, max; 'none' for CoMLRL's raw)",
    "reference_kl_enabled": "`beta` > 0",
    "reference_kl_coef": "`beta`",
}
TRAINER = {
    "agents": "`model=[model_a, model_b]` (one per agent)",
    "agent_model": "`model=` with `num_agents=`",
    "tokenizer": "`processing_class` (one, or one per agent)",
    "reward_func": "`reward_funcs`",
    "reward_processor": "a reward function that applies it to its own values",
    "model_config": "`MAGRPOConfig(model_init_kwargs=...)`",
    "wandb_config": "`MAGRPOConfig(report_to='wandb', run_name=...)` and WANDB_* variables",
    "eval_logger": "a reward function's `log_metric`/`log_extra` keywords",
    "eval_aggregator": "a reward function's `log_metric`/`log_extra` keywords",
    "dataset_type": "none (CoMLRL <= 1.4.2 labelled the wandb run with it)",
}

NAMES = FaceNames(
    face="CoMLRL",
    import_line="from trl_multiagent.comlrl import MAGRPOConfig, MAGRPOTrainer",
    docs="docs/from_comlrl.md",
    config=CONFIG,
    trainer=TRAINER,
)
