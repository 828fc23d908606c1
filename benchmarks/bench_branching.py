"""What best-only branching saves: generated tokens and step time against full expansion, side by side in one run.

Both runs train the seed task's two agents (`trl_multiagent.demo.examples`: the length-ratio reward and the feedback
transition) for `--steps` steps with the same settings, three turns, K=4 and early termination off, and differ only in
`MAGRPOConfig.branching`: `"all"` (every joint answer continues: 1 + 4 + 16 nodes per prompt, 84 completions per agent)
and `"best"` (the best joint answer continues: 3 nodes, 12 completions per agent). Each step's generated tokens are
counted from the rollout tree (`trainer.last_rollout`, every agent's completion tokens), its time from `step_time`.

    python benchmarks/bench_branching.py --model ~/.cache/trl_multiagent/SmolLM2-135M-Instruct
    python benchmarks/bench_branching.py --smoke          # a random hidden-32 model, seconds (run by the tests)
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile

import torch
from transformers import TrainerCallback

from trl_multiagent.demo.examples import PROMPTS, length_feedback, length_ratio_reward


class TreeTokens(TrainerCallback):
    """Generated tokens of each step's rollout tree (the trainer's newest tree when the step ends)."""

    def __init__(self):
        self.trainer, self.per_step = None, []

    def on_step_end(self, args, state, control, **kwargs):
        tree = self.trainer.last_rollout
        self.per_step.append(sum(len(ids) for node in tree.nodes for agent in node.completion_ids for ids in agent))


def run(path: str, branching: str, prompts: list[str], steps: int, k: int, turns: int, max_new_tokens: int) -> dict:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_multiagent import MAGRPOConfig, MAGRPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(path)
    agents = [AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32) for _ in range(2)]
    args = MAGRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="bench_branching_"), num_turns=turns, early_termination_threshold=None,
        num_generations=k, per_device_train_batch_size=len(prompts) * k, max_new_tokens=max_new_tokens,
        max_steps=steps, logging_steps=1, report_to="none", save_strategy="no", disable_tqdm=True, use_cpu=True,
        check_functions_before_training=False, branching=branching, seed=0,
    )  # fmt: skip
    tokens = TreeTokens()
    trainer = MAGRPOTrainer(
        model=agents, processing_class=tokenizer, reward_funcs=length_ratio_reward, external_transition=length_feedback,
        train_dataset=Dataset.from_dict({"prompt": prompts * steps}), args=args, callbacks=[tokens],
    )  # fmt: skip
    tokens.trainer = trainer
    trainer.train()
    logs = [h for h in trainer.state.log_history if "step_time" in h]
    return {
        "tokens": tokens.per_step,
        "step_time": [h["step_time"] for h in logs],
        "generate_s": [h["timing/generate_s"] for h in logs],
        "update_s": [h["timing/update_s"] for h in logs],
        "reward": [h["reward"] for h in logs],
        "rows_per_agent": len(trainer.last_rollout.nodes) * k,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--model", default=None, help="local model folder; default: a random hidden-32 model")
    parser.add_argument("--prompts", type=int, default=1)
    parser.add_argument("--steps", type=int, default=2, help="steps per run; the first one pays one-off costs")
    parser.add_argument("--max_new_tokens", type=int, default=32)
    parser.add_argument("--smoke", action="store_true")
    cli = parser.parse_args()
    k, turns = 4, 3
    if cli.smoke:
        cli.steps, cli.max_new_tokens = 1, 4
    path = cli.model
    if path is None:
        from trl_multiagent.demo.testing import make_model, make_tokenizer

        path = tempfile.mkdtemp(prefix="bench_branching_model_")
        tokenizer = make_tokenizer()
        make_model(tokenizer, hidden=32, layers=2).save_pretrained(path)
        tokenizer.save_pretrained(path)
    prompts = (PROMPTS * 4)[: cli.prompts]
    load_before = os.getloadavg()
    runs = {b: run(path, b, prompts, cli.steps, k, turns, cli.max_new_tokens) for b in ("all", "best")}
    print(f"model={cli.model or 'random hidden-32'} prompts={cli.prompts} K={k} T={turns} early termination off, "
          f"{cli.max_new_tokens} new tokens, {cli.steps} steps per run")  # fmt: skip
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch threads "
          f"{torch.get_num_threads()}; load average before {load_before[0]:.2f}, after {os.getloadavg()[0]:.2f}")  # fmt: skip
    print(f"{'branching':10}{'step':>5}{'rows/agent':>11}{'gen tokens':>11}{'generate s':>11}{'update s':>9}"
          f"{'step s':>8}{'reward':>8}")  # fmt: skip
    for branching, r in runs.items():
        for s in range(cli.steps):
            print(f"{branching:10}{s + 1:>5}{r['rows_per_agent']:>11}{r['tokens'][s]:>11}{r['generate_s'][s]:>11.2f}"
                  f"{r['update_s'][s]:>9.2f}{r['step_time'][s]:>8.2f}{r['reward'][s]:>8.3f}")  # fmt: skip
    for s in range(cli.steps):
        full, best = runs["all"], runs["best"]
        print(f"step {s + 1}: best-only generates {full['tokens'][s] / best['tokens'][s]:.2f}x fewer tokens and is "
              f"{full['step_time'][s] / best['step_time'][s]:.2f}x faster per step than full expansion")  # fmt: skip


if __name__ == "__main__":
    main()
