"""Peak memory of a team: one shared base with a LoRA adapter per agent, against separate full models.

Each configuration runs in a fresh process (peak RSS only grows), builds the team on a random hidden-256, 4-layer
Llama (about 24M parameters with its 32k vocabulary), and trains 2 MAGRPO steps. Reported: peak RSS over the
process's RSS after imports, i.e. weights + gradients + optimizer state + activations.

    python benchmarks/bench_memory.py                 # N = 2 and 4
    python benchmarks/bench_memory.py --smoke         # tiny model, N = 2, one step (used by the tests)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys


HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_one(layout: str, num_agents: int, hidden: int, layers: int, vocab: int, steps: int) -> dict:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from tiny import make_model, make_tokenizer

    from trl_multiagent import MAGRPOConfig, MAGRPOTrainer

    torch.set_num_threads(1)
    tokenizer = make_tokenizer()
    baseline = rss_mb()
    args = MAGRPOConfig(
        output_dir="/tmp/bench_memory", num_generations=2, per_device_train_batch_size=2, max_new_tokens=16,
        max_steps=steps, report_to="none", save_strategy="no", disable_tqdm=True, learning_rate=1e-4,
        check_functions_before_training=False,
    )  # fmt: skip
    common = dict(
        tokenizer=tokenizer, reward_func=lambda *completions: [float(len(c)) for c in completions[0]],
        train_dataset=Dataset.from_dict({"prompt": ["Describe a city in the clouds:"] * 8}), args=args,
    )  # fmt: skip
    if layout == "lora":
        lora = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
        model = make_model(tokenizer, hidden=hidden, layers=layers, vocab_size=vocab)
        trainer = MAGRPOTrainer(model=model, num_agents=num_agents, peft_config=lora, **common)
    else:
        agents = [make_model(tokenizer, seed=i, hidden=hidden, layers=layers, vocab_size=vocab) for i in range(num_agents)]
        trainer = MAGRPOTrainer(agents=agents, **common)
    trainable = sum(p.numel() for p in trainer.team.parameters() if p.requires_grad)
    total = sum(p.numel() for p in trainer.team.parameters())
    trainer.train()
    return {
        "layout": layout, "num_agents": num_agents, "params_total": total, "params_trainable": trainable,
        "peak_mb": round(rss_mb() - baseline, 1),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: run one configuration in this process
    cli = parser.parse_args()
    size = dict(hidden=64, layers=2, vocab=400, steps=1) if cli.smoke else dict(hidden=256, layers=4, vocab=32000, steps=2)
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
        print(f"{r['num_agents']:>6} {name:<22} {r['params_total']:>10,} {r['params_trainable']:>10,} {r['peak_mb']:>8}")
    for n in counts:
        lora, full = (next(r for r in rows if r["num_agents"] == n and r["layout"] == k) for k in ("lora", "full"))
        print(f"N={n}: separate full models use {full['peak_mb'] / max(lora['peak_mb'], 1e-9):.2f}x the memory of LoRA")


if __name__ == "__main__":
    main()
