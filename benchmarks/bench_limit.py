"""How close one MAGRPO step comes to the raw work it has to do.

"Naive batched compute", measured in the same run on the same weights and settings:

- one batched `generate` per agent per turn, covering every tree node of the step (turn 1: P prompts x K samples;
  turn 2: P*K nodes x K samples);
- one full-logits forward/backward per agent over all of the step's rows (left-padded prompts + completions).

Our step time is `MAGRPOTrainer`'s, from `trainer.state.log_history` (`step_time`), on the seed task with the full
tree (K=4, T=2, early termination off). The ratio ours / naive is the overhead we add (below 1.0: we skip work that the
naive computation wastes, such as logits for prompt positions and padding).

    python benchmarks/bench_limit.py                       # hidden-256, 4-layer random Llama, 6 prompts, 48 tokens
    python benchmarks/bench_limit.py --model PATH          # any local model folder (e.g. SmolLM2-135M)
    python benchmarks/bench_limit.py --smoke               # tiny, 1 step (used by the tests)

    # our step with transformers `generate` and with colocated vLLM engines, side by side (in the vLLM environment)
    .venv-vllm/bin/python benchmarks/bench_limit.py --model PATH --generation transformers,vllm

With vLLM, the generate column counts the weight syncs into the engines too (`timing/sync_s`).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch

from trl_multiagent.demo.examples import PROMPTS, length_feedback, length_ratio_reward
from trl_multiagent.evaluation import mean_ci


def build_model_dir(hidden: int, layers: int) -> str:
    from trl_multiagent.demo.testing import make_model, make_tokenizer

    path = tempfile.mkdtemp(prefix="bench_limit_")
    tokenizer = make_tokenizer()
    make_model(tokenizer, hidden=hidden, layers=layers).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def load(path: str, device: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    agents = [AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device) for _ in range(2)]
    return tokenizer, agents


def naive_step(tokenizer, agents, prompts, k: int, max_new_tokens: int, device: str) -> dict:
    """The raw work of one full-tree step, batched the plain way."""
    from trl.trainer.utils import pad

    times = {"generate": 0.0, "update": 0.0}
    rows = [[] for _ in agents]  # per agent: (prompt_ids, completion_ids)

    def generate(agent, texts):
        ids = [torch.tensor(tokenizer(t)["input_ids"]) for t in texts for _ in range(k)]
        input_ids = pad(ids, padding_value=tokenizer.pad_token_id, padding_side="left").to(device)
        mask = pad([torch.ones_like(i) for i in ids], padding_value=0, padding_side="left").to(device)
        start = time.perf_counter()
        with torch.no_grad():
            out = agent.generate(
                input_ids=input_ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=True,
                pad_token_id=tokenizer.pad_token_id,
            )  # fmt: skip
        times["generate"] += time.perf_counter() - start
        completions = out[:, input_ids.size(1) :].cpu()
        return [(p.tolist(), c.tolist()) for p, c in zip(ids, completions, strict=True)]

    turn1 = [generate(agent, prompts) for agent in agents]
    for a in range(len(agents)):
        rows[a] += turn1[a]
    texts = [[tokenizer.decode(c, skip_special_tokens=True) for _, c in turn1[a]] for a in range(len(agents))]
    next_prompts = [[] for _ in agents]
    for j in range(len(prompts) * k):
        new = length_feedback(prompts[j // k], [texts[a][j] for a in range(len(agents))], len(agents))
        for a in range(len(agents)):
            next_prompts[a].append(new[a])
    for a, agent in enumerate(agents):
        rows[a] += generate(agent, next_prompts[a])

    for a, agent in enumerate(agents):
        ids = [torch.tensor(p + c) for p, c in rows[a]]
        input_ids = pad(ids, padding_value=tokenizer.pad_token_id, padding_side="left").to(device)
        mask = pad([torch.ones_like(i) for i in ids], padding_value=0, padding_side="left").to(device)
        start = time.perf_counter()
        logits = agent(input_ids=input_ids, attention_mask=mask).logits[:, :-1]
        logps = torch.log_softmax(logits.float(), dim=-1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)
        (-(logps * mask[:, 1:]).sum() / mask.sum()).backward()
        times["update"] += time.perf_counter() - start
        agent.zero_grad(set_to_none=True)
    times["rows"] = sum(len(r) for r in rows)
    return times


PHASES = ("sync", "generate", "reward", "transition", "logps", "update")
# Completions of exactly `max_new_tokens` tokens, as each backend names it: then both backends' updates do the same
# arithmetic (the same rows and lengths; the feedback prompts differ by a digit or two), and their times compare.
FIXED_LENGTH = {"transformers": "min_new_tokens", "vllm": "min_tokens"}


def our_steps(path, prompts, k, max_new_tokens, steps, device, backend, fixed_length) -> list[dict]:
    """Train `steps` steps with one backend; each step's logged `timing/*`, `throughput/*` and `step_time`."""
    from datasets import Dataset

    from trl_multiagent import MAGRPOConfig, MAGRPOTrainer

    tokenizer, agents = load(path, device)
    args = MAGRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="bench_limit_run_"), num_turns=2, early_termination_threshold=None,
        num_generations=k, per_device_train_batch_size=len(prompts) * k, max_new_tokens=max_new_tokens,
        max_steps=steps, logging_steps=1, report_to="none", save_strategy="no", disable_tqdm=True,
        use_cpu=device == "cpu", check_functions_before_training=False, use_vllm=backend == "vllm",
        generation_kwargs={FIXED_LENGTH[backend]: max_new_tokens} if fixed_length else None,
    )  # fmt: skip
    trainer = MAGRPOTrainer(
        model=agents, processing_class=tokenizer, reward_funcs=length_ratio_reward, external_transition=length_feedback,
        train_dataset=Dataset.from_dict({"prompt": prompts * steps}), args=args,
    )  # fmt: skip
    trainer.train()
    trainer.generator.close()
    logs = []
    for entry in (h for h in trainer.state.log_history if "step_time" in h):
        out = {key: entry[key] for key in entry if key.startswith(("timing/", "throughput/")) or key == "step_time"}
        out["update_tokens"] = out["throughput/update_tokens_per_s"] * out["timing/update_s"]
        out["completion_length"] = entry["completions/mean_length"]
        logs.append(out)
    return logs


def print_steps(runs: dict) -> None:
    """Every step of every run: each phase's wall-clock seconds, this process's CPU seconds (every thread, colocated
    engines included) and the rest of the machine's CPU seconds meanwhile; the update's tokens (prompts and
    completions) and the mean completion length, which set the update's work (a completion token also pays the LM head
    and the log-softmax over the vocabulary, a prompt token does not); and the update's page faults (memory the
    allocator took fresh from the kernel, paid in kernel time)."""
    print("per step, each phase as wall s / this process's CPU s / other processes' CPU s:")
    print(f"{'run':22}{'step':>5}" + "".join(f"{p:>20}" for p in PHASES) + f"{'step s':>9}{'upd tokens':>11}"
          f"{'compl len':>10}{'upd faults':>11}")  # fmt: skip
    for (backend, repeat), logs in runs.items():
        for step, log in enumerate(logs, 1):
            cells = []
            for phase in PHASES:
                wall, cpu = log.get(f"timing/{phase}_s", 0.0), log.get(f"timing/{phase}_cpu_s", 0.0)
                other = log.get(f"timing/{phase}_other_cpu_s", float("nan"))
                cells.append(f"{wall:.2f}/{cpu:.2f}/{other:.2f}")
            label = f"{backend} #{repeat}"
            print(f"{label:22}{step:>5}" + "".join(f"{c:>20}" for c in cells)
                  + f"{log['step_time']:9.2f}{log['update_tokens']:11.0f}{log['completion_length']:10.1f}"
                  f"{log.get('timing/update_page_faults', float('nan')):11.0f}")  # fmt: skip


def within(ratios: list[float], tolerance: float = 0.05) -> str:
    """How many ratios lie within `tolerance` of 1, and their mean ± 95% CI (Student t over the ratios)."""
    interval = mean_ci(ratios)
    near = sum(abs(r - 1.0) <= tolerance for r in ratios)
    return f"{near} of {len(ratios)} within {tolerance:.0%}; mean {interval.mean:.3f} ± {interval.half_width:.3f}"


def print_noise_floor(runs: dict, backends: list[str], repeats: int, steps: int) -> None:
    """Each backend's update against itself, step by step (repeat r / repeat 1, same step): how much one step's update
    varies on this machine when nothing changes. A difference between backends smaller than this is not resolved."""
    print("noise floor: each backend's update s, repeat r / repeat 1 at the same step:")
    for backend in backends:
        first = runs[(backend, 1)]
        ratios = [
            runs[(backend, repeat)][step]["timing/update_s"] / first[step]["timing/update_s"]
            for repeat in range(2, repeats + 1)
            for step in range(steps)
        ]
        print(f"  {backend}: " + ", ".join(f"{r:.3f}" for r in ratios) + f" ({within(ratios)})")


def print_side_by_side(runs: dict, repeats: int, steps: int) -> None:
    """vLLM against transformers, step by step within each repeat: the update (seconds and tokens/s) and the step."""
    print("vLLM / transformers, step by step (update s and its tokens; update tokens/s; step s):")
    ratios = []
    for repeat in range(1, repeats + 1):
        hf, vllm = runs[("transformers", repeat)], runs[("vllm", repeat)]
        for step in range(steps):
            a, b = hf[step], vllm[step]
            ratios.append(b["timing/update_s"] / a["timing/update_s"])
            rate = "throughput/update_tokens_per_s"
            print(f"  repeat {repeat} step {step + 1}: update {b['timing/update_s']:.2f} / {a['timing/update_s']:.2f} s "
                  f"= {ratios[-1]:.3f} ({b['update_tokens']:.0f} / "
                  f"{a['update_tokens']:.0f} tokens); tokens/s {b[rate] / a[rate]:.3f}; generate phase "
                  f"{a['timing/generate_s'] + a.get('timing/sync_s', 0):.2f} -> {b['timing/generate_s'] + b['timing/sync_s']:.2f} s; "
                  f"step {a['step_time']:.2f} -> {b['step_time']:.2f} s = {a['step_time'] / b['step_time']:.2f}x faster")  # fmt: skip
    print(f"  update vLLM / transformers over every step: {within(ratios)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="local model folder; default: random hidden-256, 4-layer Llama")
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--max_new_tokens", type=int, default=48)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--generation", default="transformers",
                        help="comma-separated backends for our step: transformers, vllm (needs vLLM installed)")  # fmt: skip
    parser.add_argument("--steps", type=int, default=2, help="training steps per run (each one is reported)")
    parser.add_argument("--repeats", type=int, default=1, help="runs per backend, alternating the backends")
    parser.add_argument("--fixed_length", action="store_true",
                        help="every completion exactly --max_new_tokens long, so both backends' updates do the same work")  # fmt: skip
    parser.add_argument("--skip_naive", action="store_true", help="do not measure the naive batched compute")
    cli = parser.parse_args()
    backends = [b.strip() for b in cli.generation.split(",") if b.strip()]
    if not backends or any(b not in FIXED_LENGTH for b in backends):
        raise SystemExit(f"bench_limit: --generation takes transformers and/or vllm, got {cli.generation!r}.")
    if cli.smoke:
        cli.prompts, cli.max_new_tokens, cli.steps = 1, 4, 1
    torch.set_num_threads(max(1, torch.get_num_threads()))
    path = cli.model or build_model_dir(*((32, 2) if cli.smoke else (256, 4)))
    prompts = (PROMPTS * 4)[: cli.prompts]
    k = 4

    naive = None
    if not cli.skip_naive:
        tokenizer, agents = load(path, cli.device)
        naive_step(tokenizer, agents, prompts, k, cli.max_new_tokens, cli.device)  # warm-up
        naive = naive_step(tokenizer, agents, prompts, k, cli.max_new_tokens, cli.device)
        del agents
    runs = {}
    for repeat in range(1, cli.repeats + 1):
        for backend in backends:
            runs[(backend, repeat)] = our_steps(
                path, prompts, k, cli.max_new_tokens, cli.steps, cli.device, backend, cli.fixed_length
            )
            print(f"[bench_limit] {backend} #{repeat} done; load average {os.getloadavg()[0]:.2f}", flush=True)

    fixed = ", every completion exactly that long" if cli.fixed_length else ""
    print(
        f"model={cli.model or 'random'} prompts={cli.prompts} K={k} T=2 full tree, {cli.max_new_tokens} new tokens{fixed}"
    )
    print(f"torch threads: {torch.get_num_threads()}; load average at the end: {os.getloadavg()}")
    print_steps(runs)
    last = {backend: runs[(backend, 1)][-1] for backend in backends}  # the first step pays one-off costs
    print(f"{'':24}{'generate s':>12}{'update s':>10}{'step s':>9}   (last step of the first run)")
    if naive is not None:
        naive_total = naive["generate"] + naive["update"]
        print(f"rows per step: {naive['rows']}")
        print(f"{'naive batched compute':24}{naive['generate']:12.2f}{naive['update']:10.2f}{naive_total:9.2f}")
    for backend, run in last.items():
        label = "MAGRPOTrainer" + (" + vLLM" if backend == "vllm" else "")
        generate = run["timing/generate_s"] + run.get("timing/sync_s", 0.0)
        print(f"{label:24}{generate:12.2f}{run['timing/update_s']:10.2f}{run['step_time']:9.2f}")
        if naive is not None:
            print(f"ours ({backend}) / naive step time: {run['step_time'] / naive_total:.2f}x")
    if cli.repeats > 1:
        print_noise_floor(runs, backends, cli.repeats, cli.steps)
    if len(backends) == 2:
        print_side_by_side(runs, cli.repeats, cli.steps)


if __name__ == "__main__":
    main()
