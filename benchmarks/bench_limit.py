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
import tempfile
import time

import torch

from trl_multiagent.demo.examples import PROMPTS, length_feedback, length_ratio_reward


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


def our_step(path: str, prompts, k: int, max_new_tokens: int, steps: int, device: str, use_vllm: bool) -> dict:
    from datasets import Dataset

    from trl_multiagent import MAGRPOConfig, MAGRPOTrainer

    tokenizer, agents = load(path, device)
    args = MAGRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="bench_limit_run_"), num_turns=2, early_termination_threshold=None,
        num_generations=k, per_device_train_batch_size=len(prompts) * k, max_new_tokens=max_new_tokens,
        max_steps=steps, logging_steps=1, report_to="none", save_strategy="no", disable_tqdm=True,
        use_cpu=device == "cpu", check_functions_before_training=False, use_vllm=use_vllm,
    )  # fmt: skip
    trainer = MAGRPOTrainer(
        agents=agents, tokenizer=tokenizer, reward_func=length_ratio_reward, external_transition=length_feedback,
        train_dataset=Dataset.from_dict({"prompt": prompts * steps}), args=args,
    )  # fmt: skip
    trainer.train()
    trainer.generator.close()
    logs = [h for h in trainer.state.log_history if "step_time" in h]
    last = logs[-1]  # the first step pays one-off costs
    out = {key: last[key] for key in last if key.startswith(("timing/", "throughput/")) or key == "step_time"}
    out["generate_phase_s"] = out["timing/generate_s"] + out.get("timing/sync_s", 0.0)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="local model folder; default: random hidden-256, 4-layer Llama")
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--max_new_tokens", type=int, default=48)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--generation", default="transformers",
                        help="comma-separated backends for our step: transformers, vllm (needs vLLM installed)")  # fmt: skip
    cli = parser.parse_args()
    backends = [b.strip() for b in cli.generation.split(",") if b.strip()]
    if not backends or any(b not in ("transformers", "vllm") for b in backends):
        raise SystemExit(f"bench_limit: --generation takes transformers and/or vllm, got {cli.generation!r}.")
    if cli.smoke:
        cli.prompts, cli.max_new_tokens = 1, 4
    torch.set_num_threads(max(1, torch.get_num_threads()))
    path = cli.model or build_model_dir(*((32, 2) if cli.smoke else (256, 4)))
    prompts = (PROMPTS * 4)[: cli.prompts]
    k = 4

    tokenizer, agents = load(path, cli.device)
    naive_step(tokenizer, agents, prompts, k, cli.max_new_tokens, cli.device)  # warm-up
    naive = naive_step(tokenizer, agents, prompts, k, cli.max_new_tokens, cli.device)
    del agents
    steps = 1 if cli.smoke else 2
    ours = {b: our_step(path, prompts, k, cli.max_new_tokens, steps, cli.device, b == "vllm") for b in backends}

    naive_total = naive["generate"] + naive["update"]
    print(f"model={cli.model or 'random'} prompts={cli.prompts} K={k} T=2 full tree, {cli.max_new_tokens} new tokens")
    print(f"rows per step: {naive['rows']}")
    print(f"{'':24}{'generate s':>12}{'update s':>10}{'step s':>9}")
    print(f"{'naive batched compute':24}{naive['generate']:12.2f}{naive['update']:10.2f}{naive_total:9.2f}")
    phases = ("timing/sync_s", "timing/generate_s", "timing/reward_s", "timing/transition_s", "timing/logps_s",
              "timing/update_s")  # fmt: skip
    for backend, run in ours.items():
        label = "MAGRPOTrainer" + (" + vLLM" if backend == "vllm" else "")
        print(f"{label:24}{run['generate_phase_s']:12.2f}{run.get('timing/update_s', float('nan')):10.2f}"
              f"{run['step_time']:9.2f}")  # fmt: skip
    for backend, run in ours.items():
        print(f"{backend} phases: " + ", ".join(f"{p.split('/')[1]}={run.get(p, float('nan')):.3f}" for p in phases))
        print(f"ours ({backend}) / naive step time: {run['step_time'] / naive_total:.2f}x")
    if len(ours) == 2:
        hf, vllm = ours["transformers"], ours["vllm"]
        print(f"generate phase (syncs included), transformers / vLLM: {hf['generate_phase_s'] / vllm['generate_phase_s']:.2f}x"
              f"; step time: {hf['step_time'] / vllm['step_time']:.2f}x")  # fmt: skip
        # The two backends sample different completions, so the update's work differs: compare its rate.
        rate = "throughput/update_tokens_per_s"
        print(f"update tokens/s, vLLM / transformers: {vllm[rate]:.0f} / {hf[rate]:.0f} = {vllm[rate] / hf[rate]:.3f}")


if __name__ == "__main__":
    main()
