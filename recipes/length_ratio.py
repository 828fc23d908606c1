# /// script
# dependencies = [
#     "trl_multiagent",
# ]
# ///
"""Two agents, two turns, feedback between turns: the length-ratio example as a TRL-style script.

Agent 2 should write an answer 2 to 3 times longer than agent 1's. After turn 1, `length_feedback` tells both agents
how long their answers were, and they answer again.

Usage:

    # one process (CPU or one GPU)
    python recipes/length_ratio.py --output_dir outputs/length_ratio

    # under accelerate (multi-GPU, DeepSpeed, ...)
    accelerate launch --config_file accelerate_configs/single_gpu.yaml recipes/length_ratio.py \
        --output_dir outputs/length_ratio

    # any MAGRPOConfig / GRPOConfig field is a flag; a YAML file works too (`--config my.yaml`)
    python recipes/length_ratio.py --model_name_or_path /path/to/local/model --max_new_tokens 16 --report_to none

The recipe's defaults follow the example: num_turns=2, num_train_epochs=2, num_generations=4, 64 new tokens,
logging_steps=1, early_termination_threshold=0.9. Precedence: command-line flags > `--config` YAML > these defaults.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import TrlParser

from trl_multiagent import MAGRPOConfig, MAGRPOTrainer

PROMPTS = [
    "Describe a city in the clouds:",
    "Invent a new holiday and explain it:",
    "Write a bedtime story for a dragon:",
    "Design a playground on Mars:",
]

# The example's MAGRPOConfig values. `max_completion_length` (of which `max_new_tokens` is an alias) carries the 64, so
# that both `--max_new_tokens` and `--max_completion_length` override it from the command line.
RECIPE_DEFAULTS = {
    "output_dir": "outputs/length_ratio",
    "num_turns": 2,
    "num_train_epochs": 2,
    "num_generations": 4,
    "max_completion_length": 64,
    "logging_steps": 1,
    "early_termination_threshold": 0.9,
}


@dataclass
class ScriptArguments:
    """Arguments of the length-ratio recipe that are not training arguments."""

    model_name_or_path: str = field(
        default="HuggingFaceTB/SmolLM2-135M-Instruct",
        metadata={"help": "Model id on the Hugging Face Hub, or a local folder written by `save_pretrained`."},
    )
    num_agents: int = field(
        default=2,
        metadata={"help": "Number of agents. The length-ratio reward compares two answers, so it must be 2."},
    )
    dtype: str = field(
        default="float32",
        metadata={
            "help": "dtype to load each agent's weights in (as TRL's ModelConfig; float32 by default).",
            "choices": ["auto", "bfloat16", "float16", "float32"],
        },
    )


def build_dataset() -> Dataset:
    """The four creative prompts of the example."""
    return Dataset.from_dict({"prompt": list(PROMPTS)})


def length_ratio_reward(completions1, completions2):
    rewards = []
    for first, second in zip(completions1, completions2):
        ratio = len(second) / max(len(first), 1)
        distance = 0.0 if 2 <= ratio <= 3 else min(abs(ratio - 2), abs(ratio - 3))
        rewards.append(math.exp(-distance))
    return rewards


def length_feedback(prompt, agent_completions, num_agents, **history):
    lengths = [len(text) for text in agent_completions]
    ratio = lengths[1] / max(lengths[0], 1)
    return [
        f"{prompt}\n\nYour last answer had {lengths[i]} characters. "
        f"The second answer was {ratio:.1f} times as long as the first; "
        "the goal is 2 to 3 times. Please write an improved answer."
        for i in range(num_agents)
    ]


def make_parser() -> TrlParser:
    parser = TrlParser((ScriptArguments, MAGRPOConfig))
    # HfArgumentParser is an argparse parser: these become the defaults that a `--config` YAML or a flag overrides.
    parser.set_defaults_with_config(**RECIPE_DEFAULTS)
    return parser


def last_logged(log_history: list[dict], key: str) -> float | None:
    """The last value of `key` in `trainer.state.log_history`, or None if it was never logged."""
    for entry in reversed(log_history):
        if key in entry:
            return entry[key]
    return None


def turn_summary(trainer: MAGRPOTrainer) -> dict[str, float | None]:
    history = trainer.state.log_history
    return {
        f"turn_{t}/reward_mean": last_logged(history, f"turn_{t}/reward_mean")
        for t in range(1, trainer.args.num_turns + 1)
    }


def main(script_args: ScriptArguments, training_args: MAGRPOConfig) -> MAGRPOTrainer:
    if script_args.num_agents != 2:
        raise ValueError(
            f"length_ratio recipe: --num_agents must be 2 (the reward compares agent 2's answer with agent 1's), "
            f"got {script_args.num_agents}."
        )
    dtype = script_args.dtype if script_args.dtype == "auto" else getattr(torch, script_args.dtype)
    tokenizer = AutoTokenizer.from_pretrained(script_args.model_name_or_path)
    agents = [
        AutoModelForCausalLM.from_pretrained(script_args.model_name_or_path, dtype=dtype)
        for _ in range(script_args.num_agents)
    ]
    trainer = MAGRPOTrainer(
        agents=agents,
        tokenizer=tokenizer,
        reward_func=length_ratio_reward,
        external_transition=length_feedback,
        train_dataset=build_dataset(),
        args=training_args,
    )
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.save_model(training_args.output_dir)

    if trainer.is_world_process_zero():
        print(f"Saved {script_args.num_agents} agents under {training_args.output_dir}/agent_*/")
        for key, value in turn_summary(trainer).items():
            shown = "not logged" if value is None else f"{value:.4f}"
            print(f"last {key}: {shown}")
    return trainer


if __name__ == "__main__":
    script_args, training_args = make_parser().parse_args_and_config()
    main(script_args, training_args)
