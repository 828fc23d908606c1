"""Peak memory: of a team (one shared base with a LoRA adapter per agent, against separate full models), and of
the update as the tree grows (K and `num_turns`, with the update in chunks and in one pass).

Each configuration runs in a fresh process, builds the team on a random hidden-256, 4-layer Llama (about 24M
parameters with its 32k vocabulary), and trains MAGRPO steps.

- Teams: peak RSS over the process's RSS after imports (weights + gradients + optimizer state + activations).
- Tree (`--tree`): two full agents, `per_device_train_batch_size=8` (8 / K prompts per step), no early
  termination, so a step holds 8 * (1 + K + ... + K**(T-1)) rows per agent. The peak RSS of each phase is read from the kernel's
  high-water mark (`VmHWM`), reset when the phase starts (`/proc/self/clear_refs`): the rollout (generation, rewards,
  log-prob passes) and the update (forward + backward of every chunk). Both are reported over the RSS before the
  first step, for the second step (so both include the optimizer state the first step created).

    python benchmarks/bench_memory.py                 # teams, N = 2 and 4
    python benchmarks/bench_memory.py --tree          # K in (2, 4, 8) x num_turns in (1, 2, 3)
    python benchmarks/bench_memory.py --smoke         # tiny model, N = 2, one step (used by the tests)
    python benchmarks/bench_memory.py --tree --smoke  # tiny model, two tree shapes (used by the tests)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_one(layout: str, num_agents: int, hidden: int, layers: int, vocab: int, steps: int) -> dict:
    import torch
    from datasets import Dataset
    from peft import LoraConfig

    from trl_multiagent import MAGRPOConfig, MAGRPOTrainer
    from trl_multiagent.demo.testing import make_model, make_tokenizer

    torch.set_num_threads(1)
    tokenizer = make_tokenizer()
    baseline = rss_mb()
    args = MAGRPOConfig(
        output_dir="/tmp/bench_memory", num_generations=2, per_device_train_batch_size=2, max_new_tokens=16,
        max_steps=steps, report_to="none", save_strategy="no", disable_tqdm=True, learning_rate=1e-4,
        check_functions_before_training=False,
    )  # fmt: skip
    common = dict(
        processing_class=tokenizer, reward_funcs=lambda *completions: [float(len(c)) for c in completions[0]],
        train_dataset=Dataset.from_dict({"prompt": ["Describe a city in the clouds:"] * 8}), args=args,
    )  # fmt: skip
    if layout == "lora":
        lora = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
        model = make_model(tokenizer, hidden=hidden, layers=layers, vocab_size=vocab)
        trainer = MAGRPOTrainer(model=model, num_agents=num_agents, peft_config=lora, **common)
    else:
        agents = [
            make_model(tokenizer, seed=i, hidden=hidden, layers=layers, vocab_size=vocab) for i in range(num_agents)
        ]
        trainer = MAGRPOTrainer(model=agents, **common)
    trainable = sum(p.numel() for p in trainer.team.parameters() if p.requires_grad)
    total = sum(p.numel() for p in trainer.team.parameters())
    trainer.train()
    return {
        "layout": layout, "num_agents": num_agents, "params_total": total, "params_trainable": trainable,
        "peak_mb": round(rss_mb() - baseline, 1),
    }  # fmt: skip


def status_mb(field: str) -> float:
    """A memory line of /proc/self/status (Linux), in MB: `VmRSS` now, `VmHWM` the peak since `reset_peak`."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field)) / 1024


def reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def run_tree(k: int, turns: int, chunked: bool, hidden: int, layers: int, vocab: int, steps: int) -> dict:
    """Peak RSS of the rollout and of the update for one tree shape, in the last step."""
    import torch
    from datasets import Dataset

    from trl_multiagent import MAGRPOConfig, MAGRPOTrainer
    from trl_multiagent.demo.testing import make_model, make_tokenizer

    torch.set_num_threads(1)
    tokenizer = make_tokenizer()
    args = MAGRPOConfig(
        output_dir="/tmp/bench_memory", num_generations=k, per_device_train_batch_size=8, num_turns=turns, early_termination_threshold=None, max_new_tokens=16,
        max_steps=steps, report_to="none", save_strategy="no", disable_tqdm=True, learning_rate=1e-4,
        check_functions_before_training=False, update_chunk_size=None if chunked else 10**6,
    )  # fmt: skip
    trainer = MAGRPOTrainer(
        model=[make_model(tokenizer, seed=i, hidden=hidden, layers=layers, vocab_size=vocab) for i in range(2)],
        processing_class=tokenizer, reward_funcs=lambda *completions: [float(len(c)) / 16 for c in completions[0]],
        external_transition=lambda prompt, agent_completions, num_agents, **_: [
            f"{prompt} {c[:20]} Shorter." for c in agent_completions
        ],
        train_dataset=Dataset.from_dict({"prompt": ["Describe a city in the clouds:"] * 8}), args=args,
    )  # fmt: skip
    peaks, rows = {}, {}
    rollout, step = trainer._generate_and_score_completions, trainer.training_step

    def measured_rollout(inputs):
        reset_peak()
        out = rollout(inputs)
        peaks["rollout"] = status_mb("VmHWM") - peaks["base"]
        rows["per_agent"] = out["agents"][0]["prompt_ids"].size(0)
        reset_peak()  # from here to the end of the training step: the update
        return out

    def measured_step(*a, **kw):
        loss = step(*a, **kw)
        peaks["update"] = status_mb("VmHWM") - peaks["base"]
        return loss

    trainer._generate_and_score_completions, trainer.training_step = measured_rollout, measured_step
    peaks["base"] = status_mb("VmRSS")
    trainer.train()
    return {"k": k, "turns": turns, "chunked": chunked, "rows_per_agent": rows["per_agent"],
            "rollout_mb": round(peaks["rollout"], 1), "update_mb": round(peaks["update"], 1)}  # fmt: skip


def tree_table(smoke: bool) -> None:
    shapes = [(2, 1), (2, 2)] if smoke else [(k, t) for t in (1, 2, 3) for k in (2, 4, 8)]
    rows = []
    for k, turns in shapes:
        for chunked in (True, False):
            one = f"tree:{k}:{turns}:{int(chunked)}"
            command = [sys.executable, __file__, "--one", one] + (["--smoke"] if smoke else [])
            out = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
            if out.returncode != 0:
                raise SystemExit(f"bench_memory: {one} failed:\n{out.stderr[-4000:]}")
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(
        f"{'K':>3} {'turns':>5} {'rows/agent':>10} {'rollout MB':>10} {'update MB (chunks)':>18} {'update MB (one pass)':>20}"
    )
    for chunked, whole in zip(rows[::2], rows[1::2], strict=True):
        print(
            f"{chunked['k']:>3} {chunked['turns']:>5} {chunked['rows_per_agent']:>10} {chunked['rollout_mb']:>10} "
            f"{chunked['update_mb']:>18} {whole['update_mb']:>20}"
        )


def sizes(smoke: bool) -> dict:
    if smoke:
        return dict(hidden=64, layers=2, vocab=400, steps=1)
    return dict(hidden=256, layers=4, vocab=32000, steps=2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--tree", action="store_true", help="update memory against K and num_turns")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: run one configuration in this process
    cli = parser.parse_args()
    if cli.one and cli.one.startswith("tree:"):
        _, k, turns, chunked = cli.one.split(":")
        print(json.dumps(run_tree(int(k), int(turns), chunked == "1", **sizes(cli.smoke))))
        return
    if cli.tree:
        tree_table(cli.smoke)
        return
    size = sizes(cli.smoke)
    if cli.one:
        layout, n = cli.one.split(":")
        print(json.dumps(run_one(layout, int(n), **size)))
        return
    counts = [2] if cli.smoke else [2, 4]
    rows = []
    for n in counts:
        for layout in ("lora", "full"):
            command = [sys.executable, __file__, "--one", f"{layout}:{n}"] + (["--smoke"] if cli.smoke else [])
            out = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
            if out.returncode != 0:
                raise SystemExit(f"bench_memory: {layout} N={n} failed:\n{out.stderr[-4000:]}")
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"{'agents':>6} {'layout':<22} {'params':>10} {'trainable':>10} {'peak MB':>8}")
    for r in rows:
        name = "shared base + LoRA" if r["layout"] == "lora" else "separate full models"
        print(
            f"{r['num_agents']:>6} {name:<22} {r['params_total']:>10,} {r['params_trainable']:>10,} {r['peak_mb']:>8}"
        )
    for n in counts:
        lora, full = (next(r for r in rows if r["num_agents"] == n and r["layout"] == k) for k in ("lora", "full"))
        print(
            f"N={n}: separate full models use {full['peak_mb'] / max(lora['peak_mb'], 1e-9):.2f}x the memory of LoRA"
        )


if __name__ == "__main__":
    main()
