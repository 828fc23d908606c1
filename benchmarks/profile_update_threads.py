"""Does a colocated vLLM engine slow the update? The same update, before the engines exist, with them alive, and
after they are closed, with every thread's and every process's CPU time.

The workload is fixed (the same token ids every time, so every repetition does the same arithmetic): each agent's
forward and backward over `--rows` rows of `--length` tokens in chunks of 8, as the update's chunks run. It is timed
`--repeats` times in each of four states of one process:

1. before any engine exists;
2. after `MAGRPOTrainer(use_vllm=True)` built its engines (one per agent, in this process);
3. after one training step (the engines generated, the weights were synced into them);
4. after the engines were closed.

For each repetition it prints the wall-clock seconds, this process's CPU seconds, the busiest threads (name, CPU
seconds, the CPUs each may run on) and the busiest other processes, so that an engine thread or process taking CPU
during the update, a narrowed CPU affinity or a changed thread count would show. Run it in the vLLM environment:

    OMP_NUM_THREADS=2 .venv-vllm/bin/python benchmarks/profile_update_threads.py \\
        --model ~/.cache/trl_multiagent/SmolLM2-135M-Instruct
"""

from __future__ import annotations

import argparse
import glob
import os
import tempfile
import time

import torch

from trl_multiagent.demo.examples import PROMPTS, length_feedback, length_ratio_reward


_TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(stat_path: str) -> tuple[str, float] | None:
    try:
        with open(stat_path) as stat:
            text = stat.read()
    except OSError:
        return None
    name, fields = text[text.index("(") + 1 : text.rindex(")")], text[text.rindex(")") + 2 :].split()
    return name, (int(fields[11]) + int(fields[12])) / _TICKS


def threads() -> dict[str, tuple[str, float]]:
    return {t.split("/")[-1]: r for t in glob.glob("/proc/self/task/*") if (r := _cpu_seconds(t + "/stat"))}


def processes() -> dict[str, tuple[str, float]]:
    own = str(os.getpid())
    return {p.split("/")[-1]: r for p in glob.glob("/proc/[0-9]*") if p.split("/")[-1] != own and (r := _cpu_seconds(p + "/stat"))}  # fmt: skip


def allowed_cpus(tid: str) -> str:
    try:
        with open(f"/proc/self/task/{tid}/status") as status:
            return next(line.split()[1] for line in status if line.startswith("Cpus_allowed_list"))
    except (OSError, StopIteration):
        return "?"


def busiest(before: dict, after: dict, top: int) -> list[tuple[float, str, str]]:
    spent = [(after[k][1] - before[k][1], after[k][0], k) for k in after if k in before]
    return sorted((s for s in spent if s >= 0.01), reverse=True)[:top]


def update_workload(agents, ids: torch.Tensor) -> None:
    for agent in agents:
        for chunk in ids.split(8):
            logits = agent(input_ids=chunk).logits
            torch.log_softmax(logits.float(), dim=-1).mean().backward()
        agent.zero_grad(set_to_none=True)


def measure(label: str, agents, ids: torch.Tensor, repeats: int) -> list[float]:
    walls = []
    for repeat in range(repeats):
        t0, c0, th0, pr0 = time.perf_counter(), time.process_time(), threads(), processes()
        update_workload(agents, ids)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        th1, pr1 = threads(), processes()
        walls.append(wall)
        busy = ", ".join(
            f"{name}[{tid}] {s:.2f} s on CPUs {allowed_cpus(tid)}" for s, name, tid in busiest(th0, th1, 4)
        )
        others = ", ".join(f"{name} {s:.2f} s" for s, name, _ in busiest(pr0, pr1, 3)) or "none above 0.01 s"
        print(f"{label} #{repeat + 1}: wall {wall:.2f} s, this process's CPU {cpu:.2f} s, torch threads "
              f"{torch.get_num_threads()}; busiest threads: {busy}; other processes: {others}", flush=True)  # fmt: skip
    print(f"{label}: mean {sum(walls) / len(walls):.2f} s, best {min(walls):.2f} s; load average "
          f"{os.getloadavg()[0]:.2f}", flush=True)  # fmt: skip
    return walls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--model", required=True, help="a local model folder (SmolLM2-135M-Instruct)")
    parser.add_argument("--rows", type=int, default=48)
    parser.add_argument("--length", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=3)
    cli = parser.parse_args()

    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_multiagent import MAGRPOConfig, MAGRPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(cli.model)
    agents = [AutoModelForCausalLM.from_pretrained(cli.model, dtype=torch.float32) for _ in range(2)]
    ids = torch.randint(
        0, min(tokenizer.vocab_size, 10000), (cli.rows, cli.length), generator=torch.Generator().manual_seed(0)
    )
    print(f"CPUs this process may use: {sorted(os.sched_getaffinity(0))}; torch threads {torch.get_num_threads()}; "
          f"workload: 2 agents x {cli.rows} rows x {cli.length} tokens, forward + backward in chunks of 8")  # fmt: skip
    means = {"before the engines": measure("before the engines", agents, ids, cli.repeats)}
    args = MAGRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="profile_update_"), num_turns=2, early_termination_threshold=None,
        num_generations=4, per_device_train_batch_size=8, max_new_tokens=32, max_steps=1, logging_steps=1,
        report_to="none", save_strategy="no", disable_tqdm=True, check_functions_before_training=False, use_vllm=True,
    )  # fmt: skip
    trainer = MAGRPOTrainer(
        model=agents, processing_class=tokenizer, reward_funcs=length_ratio_reward, external_transition=length_feedback,
        train_dataset=Dataset.from_dict({"prompt": PROMPTS[:2]}), args=args,
    )  # fmt: skip
    means["engines alive"] = measure("engines alive", agents, ids, cli.repeats)
    trainer.train()
    means["after a step"] = measure("after a step", agents, ids, cli.repeats)
    trainer.generator.close()
    means["engines closed"] = measure("engines closed", agents, ids, cli.repeats)
    base = sum(means["before the engines"]) / cli.repeats
    for label, walls in means.items():
        print(f"{label:20} mean {sum(walls) / len(walls):7.2f} s = {sum(walls) / len(walls) / base:.3f} x before")


if __name__ == "__main__":
    main()
