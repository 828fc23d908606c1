# /// script
# dependencies = [
#     "trl_multiagent[demo]",
# ]
# ///
"""Two agents that act on a shared world: split information passed through a shared notebook.

Each dataset row is a two-word code split in halves. The scout (agent 0) is told the first word and may only `write`
in the notebook; the keeper (agent 1) is told the second word and may only `read` it (`Notebook.agent_tools`). In a
turn the scout acts first, then the keeper, on the same notebook (docs: Agents that act), so the keeper can give the
whole code only if the scout wrote its word and the keeper read it. Rewards, summed:

* `Notebook` (the environment's `get_reward`, weight 1): the scout's word is in the notebook;
* `full_code` (weight 1): the keeper's last words, after its tool results, hold both words (the first word can only
  come from the notebook, so there is no credit for repeating its own);
* `tool_use` (weight 0.5, TRL's per-agent convention, averaged over the agents): 1 for a tool call that parsed and
  ran.

SmolLM2-135M-Instruct was not trained to call tools. Asked to, it opens a call and often writes it well, then writes
on past its end, and the text after it breaks the parse. Generation therefore stops after a closing `</tool_call>`
(`generation_kwargs={"stop_strings": ["</tool_call>"]}`), so the call it wrote is the call that runs; after the tool
results, the agent answers. docs/agents.md, "The recipe's learning run", shows the runs without this.

Usage:

    # the embedded SmolLM2-135M-Instruct (no hub needed), with TRL's Qwen2.5 chat template, which renders tools
    python recipes/tool_team.py --output_dir outputs/tool_team

    # any chat model whose template renders tools, and any MAGRPOConfig / ModelConfig field as a flag
    python recipes/tool_team.py --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct --max_steps 100

At the end it saves the agents, `trainer_state.json` and `rewards.png` (rewards, lengths and tool calls per
completion), and prints the first-quarter / last-quarter summary and two transcripts of the first and last steps.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from datasets import Dataset
from transformers import AutoTokenizer
from trl import ModelConfig
from trl.chat_template_utils import qwen2_5_chat_template, supports_tool_calling

from trl_multiagent import MAGRPOConfig, MAGRPOTrainer
from trl_multiagent.config import ACTIVATION_CHECKPOINTING
from trl_multiagent.demo.models import prepare_default_model
from trl_multiagent.demo.plot import run_report
from trl_multiagent.demo.samples import SampleAnswers
from trl_multiagent.devices import reuse_freed_memory
from trl_multiagent.flags import FlagParser
from trl_multiagent.team.model_config import team_from_model_config


WORDS = [
    "maple", "river", "copper", "violet", "falcon", "lemon", "harbor", "pepper", "cedar", "meadow", "silver", "tiger",
    "ember", "quartz", "willow", "orbit", "canyon", "velvet", "cobalt", "jasmine",
]  # fmt: skip
# The recipe's MAGRPOConfig and ModelConfig values, under any flag or `--config` YAML: the embedded model at the size
# that fits the 30 minutes of a 2-core CPU (docs/agents.md, "The recipe's learning run").
RECIPE_DEFAULTS = {
    "output_dir": "outputs/tool_team",
    "num_generations": 4,
    "per_device_train_batch_size": 4,  # 1 code x K=4 joint answers per step
    "max_steps": 40,
    "max_completion_length": 96,  # the call, its result (about 30 tokens) and the answer: TRL counts them all
    "max_tool_calling_iterations": 1,  # one round of tool calls, then the answer
    "learning_rate": 1e-3,  # for the LoRA adapters; at the main job's 3e-3 the agents collapsed onto repeated text
    "generation_kwargs": {"stop_strings": ["</tool_call>"]},  # a call ends the turn; its results come back
    "use_peft": True,  # one shared base, one adapter per agent
    "lora_r": 16,
    "lora_alpha": 32,
    "lora_target_modules": "all-linear",
    "reward_weights": [0.5, 1.0, 1.0],  # tool_use, full_code, Notebook (the environment's reward comes last)
    "logging_steps": 1,
    ACTIVATION_CHECKPOINTING: False,  # the field's name in this transformers (`config.ACTIVATION_CHECKPOINTING`)
    "save_strategy": "no",
    "report_to": "none",
    "seed": 0,
}


def call_text(name: str, arguments: str) -> str:
    """The tool call, as the Qwen2.5 template renders one: what the prompts ask the agents to write."""
    return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'


class Notebook:
    """The team's shared world: a notebook. The scout may only write in it, the keeper only read it."""

    agent_tools = [["write"], ["read"]]  # agent 0 (scout): write; agent 1 (keeper): read

    def reset(self, first: str, second: str, **row) -> None:
        self.first, self.second, self.notes = first, second, []

    def write(self, note: str) -> str:
        """Write a note in the notebook you share with your teammate.

        Args:
            note: The text to write.
        """
        self.notes.append(str(note))
        return "Saved in the notebook."

    def read(self) -> str:
        """Read the notebook you share with your teammate."""
        return "\n".join(self.notes) or "The notebook is empty."

    def get_reward(self) -> float:
        return float(self.first in " ".join(self.notes).lower())


def scout_prompt(row: dict) -> list[dict]:
    first = row["first"]
    call = call_text("write", f'{{"note": "{first}"}}')
    return [
        {
            "role": "user",
            "content": f"The first word of the code is '{first}'. Write it in the notebook. Reply with exactly:\n{call}",
        }
    ]


def keeper_prompt(row: dict) -> list[dict]:
    second, call = row["second"], call_text("read", "{}")
    return [
        {
            "role": "user",
            "content": f"The second word of the code is '{second}'. First read the notebook: reply with exactly\n"
            f"{call}\nThen answer with the whole code: the first word, then '{second}'.",
        }
    ]


def last_words(text: str) -> str:
    """What an agent wrote after its last tool result (its answer), lower-cased."""
    return text.rsplit("</tool_response>", 1)[-1].lower()


def full_code(scout, keeper, environments):
    """1 when the keeper's answer holds both words of the code (the first one it can only have read)."""
    return [
        float(env.first in last_words(k) and env.second in last_words(k))
        for k, env in zip(keeper, environments, strict=True)
    ]


def tool_use(completions, **kwargs):
    """Per agent: 1 for a tool call that parsed and ran. With tools, TRL's completions are messages: the assistant
    turns (with their parsed `tool_calls`) and the tool results."""
    return [float(any(m.get("tool_calls") for m in messages)) for messages in completions]


def build_dataset(num_codes: int, seed: int) -> Dataset:
    rng = random.Random(seed)
    pairs = [rng.sample(WORDS, 2) for _ in range(num_codes)]
    return Dataset.from_dict({"first": [p[0] for p in pairs], "second": [p[1] for p in pairs]})


@dataclass
class ScriptArguments:
    num_codes: int = field(default=64, metadata={"help": "Codes (dataset rows) drawn from the word list."})


def tool_tokenizer(model_args: ModelConfig, training_args: MAGRPOConfig):
    """The model's tokenizer; when its chat template renders no tool calls (SmolLM2's), TRL's Qwen2.5 template, which
    uses the same <|im_start|>/<|im_end|> tokens."""
    tokenizer = AutoTokenizer.from_pretrained(
        model_args.model_name_or_path, trust_remote_code=training_args.trust_remote_code
    )
    if not supports_tool_calling(tokenizer):
        tokenizer.chat_template = qwen2_5_chat_template
    return tokenizer


def main(script_args: ScriptArguments, training_args: MAGRPOConfig, model_args: ModelConfig) -> MAGRPOTrainer:
    if model_args.model_name_or_path is None:
        with training_args.main_process_first(local=True, desc="prepare the default model"):
            model_args.model_name_or_path = prepare_default_model()
    trainer = MAGRPOTrainer(
        **team_from_model_config(model_args, 2, training_args),
        processing_class=tool_tokenizer(model_args, training_args),
        reward_funcs=[tool_use, full_code],
        environment_factory=Notebook,
        formatters=[scout_prompt, keeper_prompt],
        train_dataset=build_dataset(script_args.num_codes, training_args.seed),
        args=training_args,
    )
    samples = SampleAnswers(trainer)
    trainer.add_callback(samples)
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.save_model(training_args.output_dir)
    trainer.save_state()

    if trainer.is_world_process_zero():
        print("\n".join(run_report(trainer, samples)))
    return trainer


def make_parser() -> FlagParser:
    parser = FlagParser(
        (ScriptArguments, MAGRPOConfig, ModelConfig), allow_abbrev=False
    )  # no `--num_turn` for `--num_turns`
    parser.set_defaults_with_config(**RECIPE_DEFAULTS)
    return parser


if __name__ == "__main__":
    reuse_freed_memory()  # on a CPU only; see its docstring
    main(*make_parser().parse_args_and_config()).end()  # trackers and process groups released before exit
