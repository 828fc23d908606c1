"""The worker side of the credit suite: one spec (a trained method, the untrained team, or a mechanism check) run in
this process, returning a JSON-able dict. `run.py` starts one subprocess per spec (`--smoke`: one for all)."""

from __future__ import annotations

import math
import os
import random
import shutil
import tempfile
import time

from credit_task import (
    HELD_OUT,
    ON_TOPIC_WEIGHT,
    RATIO_WEIGHT,
    TRAIN_PROMPTS,
    chat_length_feedback,
    length_feedback,
    length_ratio_reward,
    on_topic,
    on_topic_values,
    team_reward,
)


# What each trained method changes from today's defaults (branching all, scale_rewards group, alpha 1).
METHODS = {
    "single_policy": {},  # one LoRA adapter serving both seats (see run.py's docstring)
    "defaults": {},
    "branching_best": {"branching": "best"},
    "scale_agent": {"scale_rewards": "agent"},
    "alpha_0.7": {"team_reward_weight": 0.7},
    "agent_lr": {},  # agent_learning_rates, filled in from the spec's learning rate (`agent_lr_factors`)
}
AGENT_LR_FACTORS = (1.0, 0.5)  # agent 0 at the learning rate, agent 1 at half: one untuned Dr. MAS setting


def seed_everything(seed: int) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class RolloutRecorder:
    """A `TrainerCallback` that reads `trainer.last_rollout` at every step's end: per turn the mean joint reward of
    the step's rollout, and its sampled tokens (every agent's completion tokens)."""

    def __init__(self):
        from transformers import TrainerCallback

        recorder = self

        class Callback(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                recorder.record(state.global_step)

        self.callback, self.trainer, self.steps, self.last_end = Callback(), None, [], time.perf_counter()

    def record(self, step: int) -> None:
        tree = self.trainer.last_rollout
        if tree is None:
            return
        by_turn: dict[int, list[float]] = {}
        for action in tree.joint_actions:
            by_turn.setdefault(tree.nodes[action.node].turn, []).append(action.reward)
        tokens = sum(len(ids) for node in tree.nodes for agent in node.completion_ids for ids in agent)
        now = time.perf_counter()
        self.steps.append(
            {
                "step": step,
                "tokens": tokens,
                "turns": {str(t): sum(v) / len(v) for t, v in sorted(by_turn.items())},
                "seconds": now - self.last_end,
            }  # fmt: skip
        )
        self.last_end = now


def _config(spec: dict, output_dir: str, **overrides):
    from trl_multiagent import MAGRPOConfig

    fields = dict(
        output_dir=output_dir, num_turns=spec["num_turns"], num_generations=spec["num_generations"],
        per_device_train_batch_size=spec["num_generations"], max_new_tokens=spec["max_new_tokens"],
        temperature=1.0, top_p=1.0, top_k=0, early_termination_threshold=spec["early_termination"],
        joint_mode="aligned", discount=1.0, learning_rate=spec["learning_rate"], max_steps=spec["steps"],
        logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=True, seed=spec["seed"], bf16=False,
        use_cpu=True, beta=0.0,
    )  # fmt: skip
    fields.update(overrides)
    return MAGRPOConfig(**fields)


def _dataset(spec: dict):
    from datasets import Dataset

    from trl_multiagent.demo.examples import as_user_message

    prompts = [as_user_message(p) for p in TRAIN_PROMPTS] if spec["chat"] else list(TRAIN_PROMPTS)
    return Dataset.from_dict({"prompt": prompts})


def _lora(spec: dict):
    from peft import LoraConfig

    r = spec["lora_r"]
    return LoraConfig(r=r, lora_alpha=2 * r, target_modules="all-linear")


def _tokenizer(spec: dict):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(spec["model_path"])
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def evaluate(folder: str, spec: dict, controls: bool) -> dict:
    """`trl_multiagent.evaluation.evaluate_team` on the held-out prompts: each turn's mean team reward over the
    prompts (with its 95% CI over prompts), and with `controls` the role swap and best-of-N (agent 0 in every seat,
    N samples at the team's sampled tokens)."""
    from trl_multiagent.evaluation import evaluate_team

    result = evaluate_team(
        folder, reward=team_reward, transition=chat_length_feedback if spec["chat"] else length_feedback,
        prompts=HELD_OUT, progress=False, num_turns=spec["num_turns"], num_generations=spec["eval_generations"],
        max_new_tokens=spec["max_new_tokens"], temperature=1.0, seed=spec["seed"], batch_size=spec["eval_batch"],
        prompt_format="chat" if spec["chat"] else "plain", role_swap=controls, best_of_n=controls,
    )  # fmt: skip
    out = {}
    for name, run in result["runs"].items():
        out[name] = {
            "turns": {t: run["turns"][t]["mean"] for t in run["turns"]},
            "turns_ci_over_prompts": {t: run["turns"][t]["half_width"] for t in run["turns"]},
            "sampled_tokens": run["sampled_tokens"],
            "prompts": run["turns"]["1"]["n"],
        }
        if name == "best_of_n":
            out[name]["N"] = run["N"]
            out[name]["team_sampled_tokens"] = run["team_sampled_tokens"]
    out["settings"] = result["settings"]["unit"] + "; " + result["settings"]["joint_answers"]
    return out


def train_method(spec: dict) -> dict:
    """Train one method for `steps` optimizer steps, save the team, evaluate it on the held-out prompts."""
    import torch
    from transformers import AutoModelForCausalLM

    from trl_multiagent import MAGRPOTrainer

    method = spec["method"]
    overrides = dict(METHODS[method])
    if method == "agent_lr":
        overrides["agent_learning_rates"] = [spec["learning_rate"] * f for f in AGENT_LR_FACTORS]
    work = tempfile.mkdtemp(prefix=f"credit_{method}_")
    seed_everything(spec["seed"])
    config = _config(spec, os.path.join(work, "out"), reward_weights=[RATIO_WEIGHT, ON_TOPIC_WEIGHT], **overrides)
    tokenizer = _tokenizer(spec)
    common = dict(
        reward_funcs=[length_ratio_reward, on_topic],
        external_transition=chat_length_feedback if spec["chat"] else length_feedback,
        train_dataset=_dataset(spec), args=config, processing_class=tokenizer,
    )  # fmt: skip
    if method == "single_policy":
        from peft import get_peft_model

        base = AutoModelForCausalLM.from_pretrained(spec["model_path"], dtype=torch.float32)
        policy = get_peft_model(base, _lora(spec))
        trainer = MAGRPOTrainer(model=[policy, policy], **common)  # the same module in both seats
        shared = {id(p) for p in trainer.team.agent_parameters(0)} == {id(p) for p in trainer.team.agent_parameters(1)}
        if not shared:
            raise RuntimeError("single_policy: the two seats do not share their parameters.")
    else:
        trainer = MAGRPOTrainer(model=spec["model_path"], num_agents=2, peft_config=_lora(spec), **common)
    recorder = RolloutRecorder()
    recorder.trainer = trainer
    trainer.add_callback(recorder.callback)
    start = recorder.last_end = time.perf_counter()
    try:
        trainer.train()
    except ValueError as err:  # agent_learning_rates refused by the trainer: the method is reported as skipped
        if method != "agent_lr":
            raise
        shutil.rmtree(work, ignore_errors=True)
        return {"kind": "train", "method": method, "seed": spec["seed"], "skipped": f"the trainer refused it: {err}"}
    train_s = time.perf_counter() - start
    result = {"kind": "train", "method": method, "seed": spec["seed"], "train_s": train_s, "steps": recorder.steps}
    result["optimizer_steps"] = trainer.state.global_step
    result["grad_norm"] = [h["grad_norm"] for h in trainer.state.log_history if "grad_norm" in h]
    result["sampled_tokens"] = sum(s["tokens"] for s in recorder.steps)
    if method == "agent_lr":
        rates = sorted(
            {round(g["initial_lr"] if "initial_lr" in g else g["lr"], 12) for g in trainer.optimizer.param_groups}
        )
        wanted = sorted({round(r, 12) for r in overrides["agent_learning_rates"]})
        result["optimizer_rates"] = rates
        if rates != wanted:
            return {
                **result,
                "skipped": f"agent_learning_rates not honoured: optimizer groups at {rates}, not {wanted}",
            }
    if method == "alpha_0.7":
        result["own_rewards_match"] = own_rewards_match(trainer.last_rollout)
    folder = os.path.join(work, "team")
    trainer.save_model(folder)
    del trainer
    start = time.perf_counter()
    result["eval"] = evaluate(folder, spec, controls=spec.get("controls", False))
    result["eval_s"] = time.perf_counter() - start
    shutil.rmtree(work, ignore_errors=True)
    return result


def own_rewards_match(tree) -> bool:
    """Whether every joint answer of the tree carries each agent's own reward as `credit_task` defines it:
    RATIO_WEIGHT * length_ratio + ON_TOPIC_WEIGHT * on_topic(agent i's answer) (the trainer's `own_rewards`)."""
    for index, action in enumerate(tree.joint_actions):
        answers, prompts = tree.answers(index), tree.nodes[action.node].prompts
        ratio = length_ratio_reward([answers[0]], [answers[1]])[0]
        expected = [
            RATIO_WEIGHT * ratio + ON_TOPIC_WEIGHT * on_topic_values([a], [p])[0]
            for a, p in zip(answers, prompts, strict=True)
        ]
        if action.own_rewards is None or any(
            abs(x - y) > 1e-6 for x, y in zip(action.own_rewards, expected, strict=True)
        ):
            return False
    return bool(tree.joint_actions)


def untrained(spec: dict) -> dict:
    """The untrained team (the base model in both seats; LoRA adapters at their initialisation, which PEFT starts at
    zero, so the base model's outputs), evaluated as the trained ones, with best-of-N of the base model."""
    from trl_multiagent import MAGRPOTrainer

    work = tempfile.mkdtemp(prefix="credit_untrained_")
    seed_everything(spec["seed"])
    config = _config({**spec, "steps": 1}, os.path.join(work, "out"), reward_weights=[RATIO_WEIGHT, ON_TOPIC_WEIGHT])
    trainer = MAGRPOTrainer(
        model=spec["model_path"], num_agents=2, peft_config=_lora(spec), reward_funcs=[length_ratio_reward, on_topic],
        external_transition=chat_length_feedback if spec["chat"] else length_feedback, train_dataset=_dataset(spec),
        args=config, processing_class=_tokenizer(spec),
    )  # fmt: skip
    folder = os.path.join(work, "team")
    trainer.save_model(folder)  # no step: the adapters as initialised
    del trainer
    start = time.perf_counter()
    out = {"kind": "untrained", "method": "untrained", "seed": spec["seed"], "optimizer_steps": 0, "sampled_tokens": 0}
    out["eval"] = evaluate(folder, spec, controls=True)  # best-of-N of the base model at the team's tokens
    out["eval"].pop("role_swap", None)  # both seats hold the same (base) model: a swap changes nothing
    out["eval_s"] = time.perf_counter() - start
    shutil.rmtree(work, ignore_errors=True)
    return out


def finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def run_spec(spec: dict) -> dict:
    import torch

    torch.set_num_threads(spec["threads"])
    if spec["kind"] == "train":
        return train_method(spec)
    if spec["kind"] == "untrained":
        return untrained(spec)
    import credit_mechanisms as mechanisms

    if spec["kind"] == "mechanisms":
        return mechanisms.run_all(spec)
    raise ValueError(f"unknown spec kind {spec['kind']!r}")
