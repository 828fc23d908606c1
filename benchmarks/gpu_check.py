"""The GPU check for a machine without a model hub or vLLM: one markdown table, non-zero exit on any failure.

On the GPU, in bf16, with models built from configs with random weights (no download is possible there):

1. the seed task with the transformers backend, ours against CoMLRL 1.4.3, side by side in one run
   (`bench_vs_comlrl.py`), on a model of Qwen2.5-0.5B's shape (24 layers, hidden 896, 14 heads, 2 KV heads,
   intermediate 4864, 151,936-token vocabulary, tied embeddings);
2. a shared-base LoRA team of 4 agents on that model (`MAGRPOTrainer(model=..., num_agents=4, peft_config=...)`).

Reported per run: joint answers/s, generated tokens/s inside generate, completion tokens/s of the update (the same
count on both sides: generated tokens over update seconds), peak GPU memory (peak RSS on a CPU), wall seconds.

    python benchmarks/gpu_check.py --out gpu_check.md           # on the GPU (benchmarks/gpu_check.sh installs first)
    python benchmarks/gpu_check.py --dry --out /tmp/table.md    # on a CPU, tiny sizes: the code path the tests run

The tokenizer is `trl_multiagent.demo.testing`'s 400-token one: the model's other ids decode to nothing, which changes the
texts the reward sees, not the work done (the vocabulary's full width is computed at every step).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time


HERE = os.path.dirname(os.path.abspath(__file__))
QWEN25_05B = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                  num_key_value_heads=2, vocab_size=151936, max_position_embeddings=4096)  # fmt: skip
DRY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
           vocab_size=1000, max_position_embeddings=512)  # fmt: skip
# (prompts, max_new_tokens, LoRA-team steps); K = 4, two turns, as the seed.
SIZES = {"gpu": (4, 64, 2), "dry": (1, 4, 1)}


def build_model(folder: str, shape: dict) -> str:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from trl_multiagent.demo.testing import make_tokenizer

    tokenizer = make_tokenizer()
    torch.manual_seed(0)
    config = Qwen2Config(**shape, tie_word_embeddings=True, rope_theta=1e6, pad_token_id=tokenizer.pad_token_id,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)  # fmt: skip
    Qwen2ForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def lora_team(spec: dict) -> dict:
    """A shared-base LoRA team of 4 on the seed task (runs in its own process, for its own peak memory)."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig

    from trl_multiagent import MAGRPOConfig, MAGRPOTrainer
    from trl_multiagent.demo.examples import PROMPTS, length_feedback

    joint_answers = []

    def four_way_length_reward(completions1, completions2, completions3, completions4):
        joint_answers.append(len(completions1))
        return [min(len(d) / max(len(a), 1), 3.0) for a, d in zip(completions1, completions4, strict=True)]

    import resource

    cuda = spec["device"].startswith("cuda")
    # Memory counts from here, model included, as bench_vs_comlrl.py counts it (imports are not the run's).
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    baseline_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    args = MAGRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="gpu_check_lora_"), num_generations=4, num_turns=2,
        per_device_train_batch_size=4 * spec["prompts"], max_new_tokens=spec["max_new_tokens"],
        max_steps=spec["steps"], logging_steps=1, early_termination_threshold=None, bf16=cuda, use_cpu=not cuda,
        report_to="none", save_strategy="no", disable_tqdm=True, learning_rate=1e-4,
        check_functions_before_training=False,
    )  # fmt: skip
    trainer = MAGRPOTrainer(
        model=spec["model_path"], num_agents=4, reward_funcs=four_way_length_reward,
        external_transition=length_feedback, peft_config=LoraConfig(r=16, target_modules="all-linear"),
        train_dataset=Dataset.from_dict({"prompt": (PROMPTS * 8)[: spec["prompts"] * spec["steps"]]}), args=args,
    )  # fmt: skip
    start = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - start
    steps = [e for e in trainer.state.log_history if "timing/generate_s" in e]
    generated = sum(e["throughput/generate_tokens_per_s"] * e["timing/generate_s"] for e in steps)
    update_s = sum(e["timing/update_s"] for e in steps)
    result = {"wall_s": wall, "joint_answers": sum(joint_answers), "generated_tokens": generated,
              "generate_s": sum(e["timing/generate_s"] + e.get("timing/sync_s", 0.0) for e in steps),
              "update_s": update_s}  # fmt: skip
    if cuda:
        result["peak_gpu_mb"] = torch.cuda.max_memory_allocated() / 2**20
    else:
        result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - baseline_mb
    return result


def row(name: str, r: dict | None, note: str = "") -> str:
    if r is None:
        return f"| {name} | - | - | - | - | - | {note} |"
    memory = r.get("peak_gpu_mb", r.get("peak_rss_mb"))
    cells = [r["joint_answers"] / r["wall_s"], r["generated_tokens"] / r["generate_s"],
             r["generated_tokens"] / r["update_s"], memory, r["wall_s"]]  # fmt: skip
    return f"| {name} | " + " | ".join(f"{c:.1f}" for c in cells) + f" | {note} |"


def ratio_row(ours: dict, comlrl: dict) -> str:
    def rate(r, num, den):
        return r[num] / r[den]

    cells = [rate(ours, "joint_answers", "wall_s") / rate(comlrl, "joint_answers", "wall_s"),
             rate(ours, "generated_tokens", "generate_s") / rate(comlrl, "generated_tokens", "generate_s"),
             rate(ours, "generated_tokens", "update_s") / rate(comlrl, "generated_tokens", "update_s"),
             ours.get("peak_gpu_mb", ours.get("peak_rss_mb")) / comlrl.get("peak_gpu_mb", comlrl.get("peak_rss_mb")),
             ours["wall_s"] / comlrl["wall_s"]]  # fmt: skip
    return "| ours / CoMLRL | " + " | ".join(f"{c:.2f}x" for c in cells) + " | |"


def machine(device: str) -> str:
    import torch

    if device.startswith("cuda"):
        return f"{torch.cuda.get_device_name()}, torch {torch.__version__} (CUDA {torch.version.cuda})"
    return f"{platform.processor() or platform.machine()} CPU, {os.cpu_count()} cores, torch {torch.__version__}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry", action="store_true", help="CPU, tiny model and sizes (tests)")
    parser.add_argument("--out", default="gpu_check.md", help="where the markdown table goes")
    parser.add_argument("--comlrl_python", default=sys.executable)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    cli = parser.parse_args()
    if cli.worker:  # the LoRA team, in a process of its own
        print("RESULT " + json.dumps(lora_team(json.loads(cli.worker))), flush=True)
        return 0

    import torch

    device = "cpu" if cli.dry else "cuda"
    if not cli.dry and not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; use --dry for the CPU run.", file=sys.stderr)
        return 2
    prompts, max_new_tokens, steps = SIZES["dry" if cli.dry else "gpu"]
    work = tempfile.mkdtemp(prefix="gpu_check_")
    start = time.time()
    model = build_model(os.path.join(work, "model"), DRY if cli.dry else QWEN25_05B)

    comparison = os.path.join(work, "vs_comlrl.json")
    command = [sys.executable, os.path.join(HERE, "bench_vs_comlrl.py"), "--model", model, "--device", device,
               "--dtype", "float32" if cli.dry else "bfloat16", "--prompts", str(prompts), "--max_new_tokens",
               str(max_new_tokens), "--comlrl_python", cli.comlrl_python, "--json", comparison]  # fmt: skip
    subprocess.run(command, check=True)
    with open(comparison) as f:
        compared = json.load(f)
    results = compared["results"]
    if "comlrl" not in results and not cli.dry:  # on the device, CoMLRL is half of the check
        print(f"gpu_check: {compared['skipped']}", file=sys.stderr)
        return 1

    spec = {"model_path": model, "device": device, "prompts": prompts, "max_new_tokens": max_new_tokens,
            "steps": steps}  # fmt: skip
    out = subprocess.run([sys.executable, __file__, "--worker", json.dumps(spec)], capture_output=True, text=True)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    if out.returncode != 0 or not lines:
        print(out.stdout[-3000:], out.stderr[-6000:], sep="\n", file=sys.stderr)
        print(f"gpu_check: the LoRA team run failed (exit status {out.returncode}).", file=sys.stderr)
        return 1
    team = json.loads(lines[-1][len("RESULT ") :])

    memory = "peak GPU MB" if device == "cuda" else "peak RSS MB"
    shape = "tiny Qwen2 (dry run)" if cli.dry else "Qwen2.5-0.5B shape, random weights, bf16"
    table = [
        f"GPU check, {time.strftime('%Y-%m-%d')}: {machine(device)}; {shape}; seed task, K=4, 2 turns, "
        f"{prompts} prompts, {max_new_tokens} new tokens, transformers backend; {compared['spec']['versions']}.",
        "",
        f"| run | joint answers/s | generate tokens/s | update tokens/s | {memory} | wall s | note |",
        "|---|---|---|---|---|---|---|",
        row("CoMLRL 1.4.3, 2 agents", results.get("comlrl"), "" if "comlrl" in results else "not installed"),
        row("ours, 2 agents", results["ours"]),
    ]
    if "comlrl" in results:
        table.append(ratio_row(results["ours"], results["comlrl"]))
    table.append(row("ours, shared-base LoRA team of 4 (r=16)", team, f"{steps} step{'s' if steps > 1 else ''}"))
    table += ["", f"Total time of the check: {time.time() - start:.0f} s."]
    with open(cli.out, "w") as f:
        f.write("\n".join(table) + "\n")
    print("\n".join(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
