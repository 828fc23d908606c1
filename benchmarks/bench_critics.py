"""What a learned critic costs: time per step and peak memory of the CoMLRL face's MAGRPO, IAC (a critic model per
agent, or value heads on the actors) and MAAC (one centralized critic), at the same rows per step.

Each side trains two agents in a fresh process, on a random hidden-256, 4-layer Llama (about 24M parameters with its
32k vocabulary; each critic model is another one), one turn, `max_new_tokens` tokens per answer, and 8 rows per agent
per step: MAGRPO 2 prompts x K=4, the actor-critics 8 prompts x K=1 (their only multi-turn setting). The step time is
the mean of the steps after the first (`on_step_begin` to `on_step_end`, the rollout included); the peak is the
process's peak RSS over its RSS before the trainer was built (weights, gradients, optimizer states, activations).

    python benchmarks/bench_critics.py            # 4 sides, 4 steps each (3 timed), about 5 minutes on 2 cores
    python benchmarks/bench_critics.py --smoke    # tiny model, 2 steps (used by the tests)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time


SIDES = ("magrpo", "iac", "iac_heads", "maac")
PROMPTS = [f"Describe place number {i} in one line:" for i in range(64)]


def length_ratio(completions1, completions2):
    return [len(a) / (1 + len(b)) for a, b in zip(completions1, completions2, strict=True)]


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_side(side: str, steps: int, hidden: int, layers: int, vocab: int, max_new_tokens: int) -> dict:
    import torch
    from transformers import TrainerCallback

    from trl_multiagent import comlrl
    from trl_multiagent.demo.testing import make_model, make_tokenizer

    torch.set_num_threads(1)
    tokenizer = make_tokenizer()
    baseline = rss_mb()

    def model(seed: int):
        return make_model(tokenizer, seed=seed, hidden=hidden, layers=layers, vocab_size=vocab)

    common = dict(
        output_dir=f"/tmp/bench_critics/{side}", num_turns=1, max_new_tokens=max_new_tokens, max_steps=steps,
        eval_interval=0, early_termination_threshold=None, report_to="none", save_strategy="no", disable_tqdm=True,
        logging_steps=1, agent_learning_rate=1e-5,
    )  # fmt: skip
    arguments = dict(
        agents=[model(0), model(1)], tokenizer=tokenizer, train_dataset=[{"prompt": p} for p in PROMPTS],
        reward_func=length_ratio,
    )  # fmt: skip
    if side == "magrpo":
        trainer = comlrl.MAGRPOTrainer(
            args=comlrl.MAGRPOConfig(**common, num_generations=4, rollout_buffer_size=2), **arguments
        )
    elif side == "maac":
        config = comlrl.MAACConfig(**common, rollout_buffer_size=8, critic_learning_rate=1e-5)
        trainer = comlrl.MAACTrainer(args=config, critics=[model(2)], **arguments)
    else:
        heads = side == "iac_heads"
        config = comlrl.IACConfig(
            **common, rollout_buffer_size=8, critic_learning_rate=1e-5, use_separate_critic=not heads
        )
        trainer = comlrl.IACTrainer(args=config, critics=None if heads else [model(2), model(3)], **arguments)

    times, started = [], []

    class StepClock(TrainerCallback):
        def on_step_begin(self, *_, **__):
            started.append(time.perf_counter())

        def on_step_end(self, *_, **__):
            times.append(time.perf_counter() - started[-1])

    trainer.add_callback(StepClock())
    rows = trainer.args.per_device_train_batch_size * trainer.args.steps_per_generation
    trainer.train()
    timed = times[1:] or times
    critic = getattr(trainer, "critic", None)  # the actor-critics': separate critic models, or heads on the actors
    extra = [] if critic is None else critic.shared_heads() or critic.critics
    params = sum(p.numel() for p in trainer.team.parameters()) + sum(p.numel() for m in extra for p in m.parameters())
    return {
        "side": side, "rows_per_agent": rows, "steps_timed": len(timed), "step_s": round(sum(timed) / len(timed), 3),
        "peak_mb": round(rss_mb() - baseline, 1), "params": params,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="a tiny model, 2 steps (the tests' run)")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--max_new_tokens", type=int, default=32)
    parser.add_argument("--one", help=argparse.SUPPRESS)  # run one side in this process
    args = parser.parse_args()
    size = dict(hidden=32, layers=2, vocab=None) if args.smoke else dict(hidden=256, layers=4, vocab=32000)
    steps = 2 if args.smoke else args.steps
    if args.one:
        result = run_side(args.one, steps, size["hidden"], size["layers"], size["vocab"], args.max_new_tokens)
        print(json.dumps(result))
        return
    results = []
    for side in SIDES:
        command = [sys.executable, __file__, "--one", side, "--steps", str(steps), "--max_new_tokens",
                   str(args.max_new_tokens)] + (["--smoke"] if args.smoke else [])  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        if done.returncode != 0:
            raise SystemExit(f"bench_critics: {side} failed:\n{done.stderr[-4000:]}")
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    magrpo = next(r for r in results if r["side"] == "magrpo")
    print(f"load average {os.getloadavg()[0]:.1f}; {steps} steps per side, the first untimed")
    print("| side | rows per agent | parameters (M) | step (s) | vs MAGRPO | peak RSS (MB) | vs MAGRPO |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        print(
            f"| {r['side']} | {r['rows_per_agent']} | {r['params'] / 1e6:.2f} | {r['step_s']} | "
            f"{r['step_s'] / magrpo['step_s']:.2f}x | {r['peak_mb']} | {r['peak_mb'] / max(magrpo['peak_mb'], 1e-9):.2f}x |"
        )
    print(json.dumps(results))


if __name__ == "__main__":
    main()
