"""Worker for the multi-process tool test: a team of two tiny agents acting on a shared notebook, where only rank 0's
agents call tools, so rank 0 runs a round of tool calls that rank 1 has nothing for.

Generation is real (under ZeRO-3 every `generate` gathers the agent's weights, a collective), and its tokens are then
replaced by a script: on rank 0 the scout writes and the keeper reads, on rank 1 both answer at once. Every process
must run the same number of generation calls, or the gathers fall out of step. Launched by tests/test_distributed.py
with `accelerate launch` (2 processes); writes info.json with the logged metrics.
"""

import argparse
import json
import os

from datasets import Dataset

from trl_multiagent import MAGRPOConfig, MAGRPOTrainer
from trl_multiagent.demo.testing import make_model, make_tool_tokenizer
from trl_multiagent.generation import TransformersGenerator


class Notebook:
    agent_tools = [["write"], ["read"]]

    def reset(self, **row):
        self.notes = []

    def write(self, note: str) -> str:
        """Write a note.

        Args:
            note: The text.
        """
        self.notes.append(note)
        return "ok"

    def read(self) -> str:
        """Read the notes."""
        return " ".join(self.notes)

    def get_reward(self) -> float:
        return float(len(self.notes))


def scripted(tokenizer, rank):
    real_sample = TransformersGenerator._sample

    def _sample(self, agent, prompt_ids, num_generations, greedy):
        real_sample(self, agent, prompt_ids, num_generations, greedy)  # the real generation and its collectives
        texts = []
        for ids in prompt_ids:
            text = tokenizer.decode(ids)
            for k in range(num_generations):
                if rank != 0 or text.endswith("</tool_response><|im_end|>\n<|im_start|>assistant\n"):
                    texts.append("Done.<|im_end|>")
                elif '"name": "write"' in text:
                    texts.append(
                        f'<tool_call>\n{{"name": "write", "arguments": {{"note": "n{k}"}}}}\n</tool_call><|im_end|>'
                    )
                else:
                    texts.append('<tool_call>\n{"name": "read", "arguments": {}}\n</tool_call><|im_end|>')
        return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts], None

    TransformersGenerator._sample = _sample


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--output_dir", required=True)
    cli = parser.parse_args()
    rank = int(os.environ.get("RANK", "0"))
    tokenizer = make_tool_tokenizer()
    scripted(tokenizer, rank)
    prompts = [[{"role": "user", "content": f"Task {i}."}] for i in range(4)]
    trainer = MAGRPOTrainer(
        model=[make_model(tokenizer, seed=s, max_positions=2048) for s in (1, 2)], processing_class=tokenizer,
        environment_factory=Notebook, train_dataset=Dataset.from_dict({"prompt": prompts}),
        args=MAGRPOConfig(
            output_dir=cli.output_dir, num_generations=2, per_device_train_batch_size=2, max_steps=2,
            max_completion_length=96, logging_steps=1, report_to="none", save_strategy="no", seed=0,
            shuffle_dataset=False,
        ),
    )  # fmt: skip
    trainer.train()
    trainer.save_model(os.path.join(cli.output_dir, "final"))
    if trainer.is_world_process_zero():
        with open(os.path.join(cli.output_dir, "info.json"), "w") as f:
            json.dump({"log": trainer.state.log_history, "processes": trainer.accelerator.num_processes}, f)
    trainer.end()  # Trainer's release of the process groups, before the interpreter's finalisation


if __name__ == "__main__":
    main()
