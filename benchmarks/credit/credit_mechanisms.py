"""Mechanism checks of the credit options, on tiny random models (no large model needed; seconds each).

1. **Reward scales** (`scale_rewards`). Two agents whose own rewards differ in scale: agent i's prompt carries its
   role ("A: ..." / "B: ...", per-agent `formatters`), and its own reward, in TRL's per-agent convention, is
   `scale_i * len(answer) / 100` with scale 1 for agent 0 and 100 for agent 1; `team_reward_weight=0` (alpha 0: each
   agent learns from its own reward only), one turn. After each backward, before the optimizer step
   (`TrainerCallback.on_pre_optimizer_step`, gradient clipping off with `max_grad_norm=0` so that the raw gradients
   are read), the L2 norm of each agent's gradient over its parameters (`trainer.team.agent_parameters(i)`).
   `scale_rewards="batch"` (one std over every agent's returns) against `"agent"` (each agent's own std, Dr. MAS).
   Expected: with "batch", agent 1's gradients are about 100x agent 0's; with "agent", comparable.
2. **Best-only branching at T = 3** (`branching="best"` against `"all"`). The seed's length-ratio reward and
   feedback, 3 turns, K = 4, early termination off, the same optimizer steps. Per step: the sampled tokens (every
   agent's completion tokens: all grows 4 + 16 + 64 completions per agent and prompt, best 4 + 4 + 4) and the
   turn-1 reward (which branching does not select, so it is comparable between the two); reported against steps and
   against sampled tokens.
"""

from __future__ import annotations

import math
import os
import statistics
import tempfile
import time

from credit_worker import RolloutRecorder, seed_everything


SCALES = (1.0, 100.0)


def _tiny(seed: int):
    from trl_multiagent.demo.testing import make_model, make_tokenizer

    tokenizer = make_tokenizer()
    return tokenizer, [make_model(tokenizer, seed=seed + i) for i in range(2)]


def _config(spec: dict, seed: int, **fields):
    from trl_multiagent import MAGRPOConfig

    base = dict(
        output_dir=tempfile.mkdtemp(prefix="credit_mech_"), num_generations=4, per_device_train_batch_size=4,
        max_new_tokens=spec["mech_max_new_tokens"], temperature=1.0, top_p=1.0, top_k=0, joint_mode="aligned",
        learning_rate=1e-3, max_steps=spec["mech_steps"], logging_steps=1, save_strategy="no", report_to="none",
        disable_tqdm=True, seed=seed, bf16=False, use_cpu=True, beta=0.0,
    )  # fmt: skip
    base.update(fields)
    return MAGRPOConfig(**base)


def scaled_length(completions, prompts=None, **kwargs):
    """Agent i's own reward: `scale * len(answer) / 100`, scale 100 for the agent whose prompt starts with "B:"."""
    out = []
    for completion, prompt in zip(completions, prompts or [""] * len(completions), strict=True):
        scale = SCALES[1] if str(prompt).startswith("B:") else SCALES[0]
        out.append(scale * len(completion) / 100.0)
    return out


def reward_scales(spec: dict, seed: int, scale_rewards: str) -> dict:
    from datasets import Dataset
    from transformers import TrainerCallback

    from trl_multiagent import MAGRPOTrainer, per_agent

    seed_everything(seed)
    tokenizer, agents = _tiny(seed)
    norms = [[], []]
    holder = {}

    class GradNorms(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            team = holder["trainer"].team
            for i in range(2):
                grads = [p.grad for p in team.agent_parameters(i) if p.grad is not None]
                norms[i].append(math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads)))

    config = _config(spec, seed, num_turns=1, early_termination_threshold=None, scale_rewards=scale_rewards,
                     team_reward_weight=0.0, max_grad_norm=0.0)  # fmt: skip
    trainer = MAGRPOTrainer(
        model=agents, processing_class=tokenizer, reward_funcs=[per_agent(scaled_length)], args=config,
        train_dataset=Dataset.from_dict({"prompt": ["Describe a city in the clouds:", "Design a playground on Mars:"]}),
        formatters=[lambda row: "A: " + row["prompt"], lambda row: "B: " + row["prompt"]], callbacks=[GradNorms()],
    )  # fmt: skip
    holder["trainer"] = trainer
    trainer.train()
    summary = {}
    for i in range(2):
        summary[f"agent_{i}"] = {"max": max(norms[i]), "median": statistics.median(norms[i]), "per_step": norms[i]}
    summary["ratio_median_1_over_0"] = summary["agent_1"]["median"] / max(summary["agent_0"]["median"], 1e-30)
    summary["ratio_max_1_over_0"] = summary["agent_1"]["max"] / max(summary["agent_0"]["max"], 1e-30)
    return summary


def branching_tokens(spec: dict, seed: int, branching: str) -> dict:
    from datasets import Dataset

    from trl_multiagent import MAGRPOTrainer
    from trl_multiagent.demo.examples import PROMPTS, length_feedback, length_ratio_reward

    seed_everything(seed)
    tokenizer, agents = _tiny(seed)
    config = _config(spec, seed, num_turns=3, early_termination_threshold=None, branching=branching)
    trainer = MAGRPOTrainer(
        model=agents, processing_class=tokenizer, reward_funcs=length_ratio_reward, external_transition=length_feedback,
        train_dataset=Dataset.from_dict({"prompt": list(PROMPTS)}), args=config,
    )  # fmt: skip
    recorder = RolloutRecorder()
    recorder.trainer = trainer
    trainer.add_callback(recorder.callback)
    start = time.perf_counter()
    trainer.train()
    steps = recorder.steps
    total = sum(s["tokens"] for s in steps)
    turn1 = [s["turns"]["1"] for s in steps]
    return {
        "steps": steps,
        "optimizer_steps": trainer.state.global_step,
        "sampled_tokens": total,
        "tokens_per_step": total / max(len(steps), 1),
        "turn1_reward_mean": sum(turn1) / len(turn1),
        "final_turn_reward_mean": sum(s["turns"].get("3", math.nan) for s in steps) / len(steps),
        "turn1_reward_per_1k_tokens": 1000 * (sum(turn1) / len(turn1)) / max(total / max(len(steps), 1), 1),
        "train_s": time.perf_counter() - start,
    }


def run_all(spec: dict) -> dict:
    """Both checks, over `spec["seeds"]`."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    out = {"kind": "mechanisms", "reward_scales": {}, "branching_T3": {}}
    for scale_rewards in ("batch", "agent"):
        out["reward_scales"][scale_rewards] = [reward_scales(spec, s, scale_rewards) for s in spec["seeds"]]
    for branching in ("all", "best"):
        out["branching_T3"][branching] = [branching_tokens(spec, s, branching) for s in spec["seeds"]]
    return out
