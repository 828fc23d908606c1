"""Worker for the multi-process OpenEnv fault test: a team of two tiny agents plays tiny Hanabi through TRL's OpenEnv
pattern (recipes/openenv_team.py's `HanabiTable`), each process on its own server (`--urls`, one per rank). In step
`--kill_at_step`, rank 1 kills its server (`--kill_pid`, SIGKILL) between agent 0's move and agent 1's
(`--kill_when before_move`), or after agent 1's (`after_move`: the next step's reset fails), so that only rank 1
loses its worlds. Generation is real, then its tokens are replaced by the moves (as
run_tool_team.py does). Checkpoints every step. Launched by tests/test_openenv.py with torchrun (2 gloo processes).
"""

import argparse
import json
import os
import signal
import sys

from datasets import Dataset


sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "recipes")
)

import openenv_team  # noqa: E402

from trl_multiagent import MAGRPOConfig, MAGRPOTrainer  # noqa: E402
from trl_multiagent.demo.testing import make_model, make_tool_tokenizer  # noqa: E402
from trl_multiagent.generation import TransformersGenerator  # noqa: E402


TOOL_RESULT_END = "</tool_response><|im_end|>\n<|im_start|>assistant\n"


def scripted(tokenizer, rank, kill_at_step, kill_pid, kill_when):
    real_sample = TransformersGenerator._sample
    seen = {"steps": 0}

    def _sample(self, agent, prompt_ids, num_generations, greedy):
        real_sample(self, agent, prompt_ids, num_generations, greedy)
        texts = []
        for ids in prompt_ids:
            text = tokenizer.decode(ids)
            if agent == 1 and "tiny Hanabi" in text and not text.endswith(TOOL_RESULT_END):
                seen["steps"] += 1
                if rank == 1 and seen["steps"] == kill_at_step and kill_when == "before_move":
                    os.kill(kill_pid, signal.SIGKILL)  # agent 1's move of this step fails
            if agent == 1 and "tiny Hanabi" in text and text.endswith(TOOL_RESULT_END):
                if rank == 1 and seen["steps"] == kill_at_step and kill_when == "after_move":
                    os.kill(kill_pid, signal.SIGKILL)  # this step's game is over: the next step's reset fails
            for k in range(num_generations):
                if text.endswith(TOOL_RESULT_END) or "tiny Hanabi" not in text:
                    texts.append("Done.<|im_end|>")
                else:
                    move = json.dumps({"name": "play", "arguments": {"action": k % 3}})
                    texts.append(f"<tool_call>\n{move}\n</tool_call><|im_end|>")
        return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts], None

    TransformersGenerator._sample = _sample


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--urls", nargs="+", required=True)
    parser.add_argument("--kill_at_step", type=int, default=2)
    parser.add_argument("--kill_pid", type=int, required=True)
    parser.add_argument("--kill_when", choices=["before_move", "after_move"], default="before_move")
    cli = parser.parse_args()
    rank = int(os.environ.get("RANK", "0"))
    with open(os.path.join(cli.output_dir, f"pid_rank{rank}"), "w") as f:
        f.write(str(os.getpid()))
    tokenizer = make_tool_tokenizer()
    scripted(tokenizer, rank, cli.kill_at_step, cli.kill_pid, cli.kill_when)
    openenv_team.HanabiTable.url = cli.urls[rank]
    openenv_team.HanabiTable.timeout = 10.0
    deals = [(0, 0), (0, 1), (1, 1), (1, 0)] * 2
    trainer = MAGRPOTrainer(
        # room for agent 1's prompt (two tools' schemas in a tiny byte-level vocabulary), its call and the result
        model=[make_model(tokenizer, seed=s, max_positions=4096) for s in (1, 2)], processing_class=tokenizer,
        reward_funcs=openenv_team.reward_func, environment_factory=openenv_team.HanabiTable,
        formatters=[openenv_team.first_player_prompt, openenv_team.second_player_prompt],
        train_dataset=Dataset.from_dict({"card_0": [d[0] for d in deals], "card_1": [d[1] for d in deals]}),
        args=MAGRPOConfig(
            output_dir=cli.output_dir, num_generations=2, per_device_train_batch_size=2, max_steps=4,
            max_completion_length=256, max_tool_calling_iterations=1, logging_steps=1, report_to="none",
            save_strategy="steps", save_steps=1, seed=0, shuffle_dataset=False,
        ),
    )  # fmt: skip
    trainer.train()
    if trainer.is_world_process_zero():
        with open(os.path.join(cli.output_dir, "info.json"), "w") as f:
            json.dump({"log": trainer.state.log_history}, f)
    trainer.end()  # Trainer's release of the process groups, before the interpreter's finalisation


if __name__ == "__main__":
    main()
