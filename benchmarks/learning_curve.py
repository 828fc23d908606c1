"""Learning curves on the seed task: ours and CoMLRL 1.4.3, the same wall-clock budget, measured the same way.

Both trainers train the two agents of the seed example (`trl_multiagent.demo.examples`: the length-ratio reward, the
feedback transition, its four prompts) on the same model folder, each in its own fresh subprocess, one run after the
other (so that they never share the CPU), for `--budget_s` seconds of `trainer.train()` each, over `--seeds`.

The task is the same on both sides: 2 agents, 2 turns, K=4 generations, early termination at 0.9 (a prompt's
turn-1 node, its K joint answers, grows a second turn only when their mean reward is at most 0.9), `--max_new_tokens`, temperature `--temperature`, top_p 1.0, no top-k, one
prompt per step, joint answers aligned. Only the learning side differs: each trainer's learning rate
(`--ours_lr`, `--comlrl_lr`), optimizer and update rule (ours: TRL's loss, `--ours_loss_type`, optionally shared-base
LoRA with `--ours_lora_r`; CoMLRL: its own REINFORCE-style update, its defaults otherwise).

**One measurement for both.** The reward function each trainer calls is wrapped in one timestamped recorder
(`RewardRecorder`): every joint answer it scores is written with the seconds since `train()` started and its turn (a
turn-2 prompt carries the feedback text). The transition is wrapped too, so that each turn-2 joint answer is recorded
with its own parent's turn-1 reward: the second-turn value is measured as turn-2 reward minus the parent's, which
early termination does not bias (only the parents below the threshold have children, and each child is compared with
its own parent). The run stops at the first reward call past the budget.

Written to `--out` (default `benchmarks/learning`): `records/<trainer>_seed<s>.jsonl` (every scored joint answer),
`learning_curve.png` (turn-1 and turn-2 reward against wall-clock seconds, both trainers, mean over seeds of the
binned rewards, with a smoothed line), and `learning_curve.md`: the settings, and per trainer the first-quarter and
last-quarter mean reward of each turn over the budget, their difference with its standard error over the seeds, the
time at which the seed-mean curve first reaches `--target`, and the second-turn value over the last quarter.

    python benchmarks/learning_curve.py --budget_s 600 --seeds 0 1 2 --comlrl_python ~/.venvs/comlrl/bin/python
    python benchmarks/learning_curve.py --trainers ours --ours_lora_r 16 --ours_lr 3e-4      # one side only
    python benchmarks/learning_curve.py --smoke        # a random hidden-32 model, a few seconds (run by the tests)

CoMLRL is installed as for `bench_vs_comlrl.py` (docs/benchmark_vs_comlrl.md has the commands); without it the
script runs ours and says that CoMLRL was skipped.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time

# the same tiny model, versions, CoMLRL check and subprocess launch as bench_vs_comlrl.py
from bench_vs_comlrl import (
    INSTALL_HINT,
    build_tiny_model,
    comlrl_available,
    library_versions,
    load_average,
    run_in_subprocess,
    source_revision,
)

from trl_multiagent.demo.examples import (
    PROMPTS,
    as_user_message,
    chat_length_feedback,
    length_feedback,
    length_ratio_reward,
)
from trl_multiagent.demo.summary import mean, mean_and_se, smooth


HERE = os.path.dirname(os.path.abspath(__file__))
TRAINERS = ("ours", "comlrl")
FEEDBACK_TEXT = "Your last answer had "  # only turn-2 prompts (written by length_feedback) contain it


class BudgetReached(Exception):
    """Raised from the reward call past the budget: the run stops there, on both trainers alike."""


def prompt_text(prompt) -> str:
    """A prompt's text: the string, or the last message's content of a chat prompt."""
    return prompt[-1]["content"] if isinstance(prompt, list) else str(prompt)


class RewardRecorder:
    """Wraps the seed's reward and transition; writes one JSON line per scored joint answer.

    Each line: `t` (seconds since `start()`), `turn`, `reward`, and for turn 2 `parent` (the turn-1 reward of the
    joint answer whose feedback this prompt carries, found through the transition that wrote it).
    """

    def __init__(self, path: str, budget_s: float):
        self.file = open(path, "w")
        self.budget_s = budget_s
        self.start_time = None
        self.parent_reward = {}  # agent 0's turn-2 prompt text -> the turn-1 reward of the joint answer it follows

    def start(self):
        self.start_time = time.perf_counter()

    def reward(self):
        recorder = self

        def length_ratio_reward_recorded(completions1, completions2, *, prompts=None):
            rewards = length_ratio_reward(completions1, completions2)
            if recorder.start_time is None:  # ours checks the function once with placeholders when it is built
                return rewards
            t = time.perf_counter() - recorder.start_time
            first_agent = _first_agent_prompts(prompts, len(completions1))
            for j, reward in enumerate(rewards):
                text = prompt_text(first_agent[j]) if first_agent else ""
                line = {"t": round(t, 3), "turn": 2 if FEEDBACK_TEXT in text else 1, "reward": reward}
                if line["turn"] == 2:
                    line["parent"] = recorder.parent_reward.get(text)
                recorder.file.write(json.dumps(line) + "\n")
            recorder.file.flush()
            if t > recorder.budget_s:
                raise BudgetReached
            return rewards

        length_ratio_reward_recorded.__name__ = "length_ratio_reward"
        return length_ratio_reward_recorded

    def transition(self, feedback):
        recorder = self

        def length_feedback_recorded(prompt, agent_completions, num_agents, **history):
            out = feedback(prompt, agent_completions, num_agents, **history)
            parent = length_ratio_reward([agent_completions[0]], [agent_completions[1]])[0]
            recorder.parent_reward[prompt_text(out[0])] = parent
            return out

        length_feedback_recorded.__name__ = "length_feedback"
        return length_feedback_recorded


def _first_agent_prompts(prompts, n: int):
    """Agent 0's prompt per joint answer. Ours passes one list per agent; CoMLRL passes the prompts of one joint answer
    (one per agent, or the row's prompt)."""
    if not prompts:
        return None
    if isinstance(prompts[0], (list, tuple)) and prompts[0] and not isinstance(prompts[0][0], dict):
        return list(prompts[0])
    return [prompts[0]] * n


# ---------------------------------------------------------------------- worker side (one trainer, one seed)


def pad_outside_chat_template(tokenizer) -> None:
    """Pad with a special token that the chat template does not write. CoMLRL 1.4.3 takes a prompt's first pad token
    as the prompt's end: with the template's end-of-turn token as pad (SmolLM2 pads with <|im_end|>), it reads every
    completion as empty. Both trainers get the same tokenizer."""
    sample = tokenizer.apply_chat_template(as_user_message("x"), tokenize=False, add_generation_prompt=True)
    unused = [token for token in tokenizer.all_special_tokens if token not in sample]
    if tokenizer.pad_token in sample:
        if not unused:
            raise SystemExit(
                f"learning_curve: every special token of the tokenizer is in its chat template {sample!r}."
            )
        tokenizer.pad_token = unused[0]


def templated_task(tokenizer):
    """The seed's prompts and feedback as text with the chat template applied, for a trainer that takes text: the
    same tokens as ours on the conversational dataset."""
    originals = {}

    def template(text):
        templated = tokenizer.apply_chat_template(as_user_message(text), tokenize=False, add_generation_prompt=True)
        originals[templated] = text
        return templated

    def templated_length_feedback(prompt, agent_completions, num_agents, **history):
        texts = length_feedback(originals[prompt], agent_completions, num_agents, **history)
        return [template(text) for text in texts]

    return [template(p) for p in PROMPTS], templated_length_feedback


def run_worker(trainer_name: str, spec: dict) -> dict:
    import random

    import numpy as np
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(spec["threads"])
    seed = spec["seed"]
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    recorder = RewardRecorder(spec["records"], spec["budget_s"])
    chat = spec["prompt_format"] == "chat"
    tokenizer = AutoTokenizer.from_pretrained(spec["model_path"])
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if chat:
        pad_outside_chat_template(tokenizer)
    if not chat:
        prompts, feedback = list(PROMPTS), length_feedback
    elif trainer_name == "ours":  # a conversational dataset: ours applies the chat template
        prompts, feedback = [as_user_message(p) for p in PROMPTS], chat_length_feedback
    else:  # CoMLRL formats text: it gets the same prompts with the chat template already applied
        prompts, feedback = templated_task(tokenizer)
    dataset = Dataset.from_dict({"prompt": prompts})
    task = dict(num_generations=4, num_turns=2, max_new_tokens=spec["max_new_tokens"], top_p=1.0, top_k=0,
                temperature=spec["temperature"], early_termination_threshold=0.9, joint_mode="aligned",
                discount=1.0)  # fmt: skip
    epochs = 1_000_000  # the budget ends the run

    if trainer_name == "comlrl":
        os.environ.setdefault("WANDB_MODE", "disabled")
        from comlrl.trainers.reinforce import MAGRPOConfig as CoMAGRPOConfig
        from comlrl.trainers.reinforce import MAGRPOTrainer as CoMAGRPOTrainer

        agents = [AutoModelForCausalLM.from_pretrained(spec["model_path"], dtype=torch.float32) for _ in range(2)]
        config = CoMAGRPOConfig(
            **task, num_train_epochs=epochs, agent_learning_rate=spec["learning_rate"], num_agents=2,
            agent_devices=spec["device"], eval_interval=0, logging_steps=10**9,
        )  # fmt: skip
        trainer = CoMAGRPOTrainer(model=agents, num_agents=2, processing_class=tokenizer, train_dataset=dataset,
                                  reward_funcs=recorder.reward(), external_transition=recorder.transition(feedback),
                                  args=config)  # fmt: skip
        trainer.verbose = False
    else:
        from trl_multiagent import MAGRPOConfig, MAGRPOTrainer

        config = MAGRPOConfig(
            **task, output_dir=tempfile.mkdtemp(prefix="learning_curve_ours_"), num_train_epochs=epochs,
            learning_rate=spec["learning_rate"], loss_type=spec["loss_type"], per_device_train_batch_size=4,
            logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=True, seed=seed, bf16=False,
            use_cpu=spec["device"] == "cpu",
        )  # fmt: skip
        team = dict(reward_funcs=recorder.reward(), external_transition=recorder.transition(feedback),
                    train_dataset=dataset, args=config, processing_class=tokenizer)  # fmt: skip
        if spec["lora_r"]:
            from peft import LoraConfig

            lora = LoraConfig(r=spec["lora_r"], lora_alpha=2 * spec["lora_r"], target_modules="all-linear")
            trainer = MAGRPOTrainer(model=spec["model_path"], num_agents=2, peft_config=lora, **team)
        else:
            agents = [AutoModelForCausalLM.from_pretrained(spec["model_path"], dtype=torch.float32) for _ in range(2)]
            trainer = MAGRPOTrainer(model=agents, **team)

    recorder.start()
    try:
        trainer.train()
    except BudgetReached:
        pass
    wall_s = time.perf_counter() - recorder.start_time
    recorder.file.close()
    return {"trainer": trainer_name, "seed": seed, "wall_s": wall_s}


# ---------------------------------------------------------------------- analysis (plain functions)


def read_records(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def window_mean(records: list[dict], turn: int, start: float, end: float, key=lambda r: r["reward"]) -> float:
    values = [key(r) for r in records if r["turn"] == turn and start <= r["t"] < end]
    return mean([v for v in values if v is not None])


def binned_curve(runs: list[list[dict]], turn: int, budget_s: float, bins: int) -> tuple[list[float], list[float]]:
    """Bin centres (s) and the mean over runs of each run's mean reward in the bin (a run with no answer there is
    left out of that bin's mean)."""
    width = budget_s / bins
    centres, values = [], []
    for b in range(bins):
        per_run = [window_mean(r, turn, b * width, (b + 1) * width) for r in runs]
        centres.append((b + 0.5) * width)
        values.append(mean([v for v in per_run if not math.isnan(v)]))
    return centres, values


def summarize(runs: list[list[dict]], budget_s: float, target: float, bins: int) -> dict:
    """Per turn: first- and last-quarter means (over seeds), the last-minus-first difference with its SE over seeds,
    and when the seed-mean binned curve first reaches `target`; the second-turn value over the last quarter."""
    quarter = budget_s / 4
    out = {}
    for turn in (1, 2):
        first = [window_mean(r, turn, 0, quarter) for r in runs]
        last = [window_mean(r, turn, budget_s - quarter, budget_s + 1e9) for r in runs]
        diff, diff_se = mean_and_se([b - a for a, b in zip(first, last, strict=True)])
        centres, values = binned_curve(runs, turn, budget_s, bins)
        reached = next((c for c, v in zip(centres, values, strict=True) if not math.isnan(v) and v >= target), None)
        out[turn] = {"first": mean_and_se(first), "last": mean_and_se(last), "diff": (diff, diff_se),
                     "learns": bool(diff > 2 * diff_se), "time_to_target": reached}  # fmt: skip
    gains = [
        window_mean(r, 2, budget_s - quarter, budget_s + 1e9, key=lambda x: None if x.get("parent") is None
                    else x["reward"] - x["parent"])
        for r in runs
    ]  # fmt: skip
    out["second_turn_value"] = mean_and_se(gains)
    out["answers"] = [len(r) for r in runs]
    return out


# ---------------------------------------------------------------------- driver side


def plot(curves: dict, budget_s: float, out_png: str, title: str) -> str:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(11.0, 4.2), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, 2, sharey=True)
    colors = {"ours": "tab:blue", "comlrl": "tab:orange"}
    for ax, turn in zip(axes, (1, 2), strict=True):
        for trainer, by_turn in curves.items():
            centres, values = by_turn[turn]
            ax.plot(centres, values, "o", markersize=3, alpha=0.35, color=colors[trainer])
            ax.plot(centres, smooth(values, 5), "-", linewidth=2, color=colors[trainer],
                    label=f"{trainer} (smoothed)")  # fmt: skip
        ax.set_title(f"turn {turn}: joint reward (dots: mean over seeds per time bin)", fontsize=10)
        ax.set_xlabel("wall-clock seconds of train()")
        ax.set_xlim(0, budget_s)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    axes[0].set_ylabel("joint reward (length ratio)")
    figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    figure.savefig(out_png, format="png")
    return out_png


def fmt_pm(value_se: tuple[float, float]) -> str:
    value, se = value_se
    return f"{value:.3f}" if math.isnan(se) else f"{value:.3f} ± {se:.3f}"


def report(spec: dict, summaries: dict, trainers_lr: dict, walls: dict, skipped: str | None) -> str:
    lines = ["# Learning curve: ours vs CoMLRL on the seed task", ""]
    lines.append(f"Command: `{spec['command']}`")
    lines.append("")
    lines.append(f"Model {spec['model_desc']}; {spec['versions']}; trl_multiagent {spec['revision']}; "
                 f"{spec['threads']} torch threads; load average before {spec['load_before']}, after "
                 f"{spec['load_after']}; CPUs {os.cpu_count()}.")  # fmt: skip
    lines.append(f"Task (both): 2 agents, 2 turns, K=4, early termination 0.9, {spec['max_new_tokens']} new tokens, "
                 f"temperature {spec['temperature']}, top_p 1.0, no top-k, 1 prompt per step, prompts "
                 f"{spec['prompt_format']}; budget {spec['budget_s']:.0f} s of train() per run; seeds {spec['seeds']}.")  # fmt: skip
    for trainer, settings in trainers_lr.items():
        lines.append(f"- {trainer}: {settings}")
    if skipped:
        lines.append(f"- NOTE: {skipped}")
    lines += ["", "Mean reward over the first and last quarter of the budget (mean over seeds ± SE over seeds); the "
              "difference is last minus first per seed; 'learns' = difference > 2 SE. Second-turn value: turn-2 "
              "reward minus its own parent's turn-1 reward, over the last quarter.", ""]  # fmt: skip
    lines.append("| trainer | turn | first quarter | last quarter | last - first | learns | "
                 f"time to {spec['target']} (s) | joint answers per run |")  # fmt: skip
    lines.append("|---|---|---|---|---|---|---|---|")
    for trainer, s in summaries.items():
        for turn in (1, 2):
            t = s[turn]
            reached = "not reached" if t["time_to_target"] is None else f"{t['time_to_target']:.0f}"
            lines.append(f"| {trainer} | {turn} | {fmt_pm(t['first'])} | {fmt_pm(t['last'])} | {fmt_pm(t['diff'])} "
                         f"| {'yes' if t['learns'] else 'no'} | {reached} | {s['answers']} |")  # fmt: skip
    lines.append("")
    for trainer, s in summaries.items():
        lines.append(f"- {trainer}: second-turn value (last quarter) {fmt_pm(s['second_turn_value'])}; wall s per run "
                     + ", ".join(f"{w:.0f}" for w in walls[trainer]))  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2", help="smollm2 (the embedded default model) or a local folder")
    parser.add_argument("--smoke", action="store_true", help="random hidden-32 model, 4 tokens, a few seconds")
    parser.add_argument("--budget_s", type=float, default=600.0, help="seconds of train() per run")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--trainers", default="ours,comlrl", help="comma-separated subset of ours,comlrl")
    parser.add_argument("--comlrl_python", default=os.environ.get("COMLRL_PYTHON", sys.executable),
                        help="interpreter that has comlrl installed (default: $COMLRL_PYTHON, else this one)")  # fmt: skip
    parser.add_argument("--max_new_tokens", type=int, default=24)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--prompt_format", choices=["plain", "chat"], default="plain",
                        help="chat: the model's chat template (ours: a conversational dataset; CoMLRL: the same "
                        "prompts with the template applied as text)")  # fmt: skip
    parser.add_argument("--ours_lr", type=float, default=3e-4)
    parser.add_argument("--ours_lora_r", type=int, default=16, help="shared-base LoRA rank; 0 = full fine-tuning")
    parser.add_argument("--ours_loss_type", default="dapo")
    parser.add_argument("--comlrl_lr", type=float, default=1e-5)
    parser.add_argument("--target", type=float, default=0.6, help="reward level for 'time to target'")
    parser.add_argument("--bins", type=int, default=20, help="time bins of the curves")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: one per CPU)")
    parser.add_argument("--out", default=os.path.join(HERE, "learning"), help="output folder")
    parser.add_argument("--worker", choices=TRAINERS, help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    cli = parser.parse_args()

    if cli.worker:
        print("RESULT " + json.dumps(run_worker(cli.worker, json.loads(cli.spec))), flush=True)
        return

    trainers = [t.strip() for t in cli.trainers.split(",") if t.strip()]
    if not trainers or any(t not in TRAINERS for t in trainers):
        raise SystemExit(f"learning_curve: --trainers takes a subset of {TRAINERS}, got {cli.trainers!r}.")
    skipped = None
    if "comlrl" in trainers:
        ok, detail = comlrl_available(cli.comlrl_python)
        if not ok:
            trainers.remove("comlrl")
            skipped = f"CoMLRL skipped: not importable with {cli.comlrl_python} ({detail}). Install: {INSTALL_HINT}"
            print(f"NOTE: {skipped}", flush=True)
    os.makedirs(os.path.join(cli.out, "records"), exist_ok=True)
    workdir = tempfile.mkdtemp(prefix="learning_curve_")
    if cli.smoke:
        model_path, model_desc = build_tiny_model(workdir, hidden=32, layers=2), "random hidden-32 Llama (smoke)"
        cli.max_new_tokens, cli.budget_s, cli.bins = 4, min(cli.budget_s, 3.0), 4
    elif cli.model == "smollm2":
        from trl_multiagent.demo.models import prepare_default_model

        model_path, model_desc = prepare_default_model(), "SmolLM2-135M-Instruct (trl_multiagent.demo.models)"
    else:
        model_path, model_desc = cli.model, cli.model
    threads = cli.threads or (1 if cli.smoke else os.cpu_count() or 1)
    spec = {"model_path": model_path, "device": "cpu", "threads": threads,
            "budget_s": cli.budget_s, "max_new_tokens": cli.max_new_tokens, "temperature": cli.temperature,
            "prompt_format": cli.prompt_format}  # fmt: skip
    learning = {
        "ours": {"learning_rate": cli.ours_lr, "lora_r": cli.ours_lora_r, "loss_type": cli.ours_loss_type},
        "comlrl": {"learning_rate": cli.comlrl_lr},
    }
    load_before = load_average()
    walls, runs = {t: [] for t in trainers}, {t: [] for t in trainers}
    for seed in cli.seeds:
        for trainer in trainers:  # interleaved, so that load from elsewhere hits both sides alike
            records = os.path.join(cli.out, "records", f"{trainer}_seed{seed}.jsonl")
            python = cli.comlrl_python if trainer == "comlrl" else sys.executable
            print(f"running {trainer}, seed {seed}, {cli.budget_s:.0f} s ...", flush=True)
            result = run_in_subprocess(
                trainer, {**spec, **learning[trainer], "seed": seed, "records": records}, python, script=__file__
            )
            walls[trainer].append(result["wall_s"])
            runs[trainer].append(read_records(records))
            print(f"  {len(runs[trainer][-1])} joint answers in {result['wall_s']:.0f} s", flush=True)
    summaries = {t: summarize(runs[t], cli.budget_s, cli.target, cli.bins) for t in trainers}
    curves = {t: {turn: binned_curve(runs[t], turn, cli.budget_s, cli.bins) for turn in (1, 2)} for t in trainers}
    command = "python benchmarks/learning_curve.py " + " ".join(sys.argv[1:])
    meta = {**spec, "seeds": cli.seeds, "target": cli.target, "model_desc": model_desc, "command": command,
            "versions": library_versions(), "revision": source_revision(), "load_before": load_before,
            "load_after": load_average()}  # fmt: skip
    settings = {t: ", ".join(f"{k} {v}" for k, v in learning[t].items()) for t in trainers}
    text = report(meta, summaries, settings, walls, skipped)
    with open(os.path.join(cli.out, "learning_curve.md"), "w") as f:
        f.write(text)
    try:
        png = plot(curves, cli.budget_s, os.path.join(cli.out, "learning_curve.png"),
                   f"seed task on {model_desc}: mean of {len(cli.seeds)} seeds, {cli.budget_s:.0f} s per run")  # fmt: skip
        print(f"Plot: {png}")
    except ImportError:
        print("No plot: matplotlib is missing (pip install matplotlib).")
    print(text)


if __name__ == "__main__":
    main()
