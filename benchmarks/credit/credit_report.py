"""The credit suite's statistics, tables and plots, from the workers' results (plain functions).

Intervals are over seeds: one value per seed (a held-out turn's mean team reward over the prompts, a training
window's mean reward, a gradient-norm ratio), mean ± t(0.975, n - 1) · s / sqrt(n) (`trl_multiagent.evaluation.
mean_ci`). Comparison lines are written from the intervals only (`compare`).
"""

from __future__ import annotations

import math
import os

from credit_task import HELD_OUT, ON_TOPIC_WEIGHT, RATIO_WEIGHT, TRAIN_PROMPTS


TURNS = ("1", "2")
ORDER = ["untrained", "single_policy", "defaults", "branching_best", "scale_agent", "alpha_0.7", "agent_lr"]


def interval(values) -> dict:
    from trl_multiagent.evaluation import mean_ci

    values = [v for v in values if v is not None and math.isfinite(v)]
    ci = mean_ci(values)
    return {"mean": ci.mean, "half_width": ci.half_width, "low": ci.low, "high": ci.high, "n": ci.n,
            "values": values}  # fmt: skip


def compare(a: dict, b: dict, name: str = "defaults") -> str:
    """'higher/lower than `name` (intervals do not overlap)' or 'not distinguishable from `name` (...)'.

    >>> compare({"mean": 0.8, "low": 0.7, "high": 0.9, "half_width": 0.1}, {"mean": 0.5, "low": 0.4, "high": 0.6, "half_width": 0.1})
    'higher than defaults (intervals do not overlap)'
    >>> compare({"mean": 0.55, "low": 0.45, "high": 0.65, "half_width": 0.1}, {"mean": 0.5, "low": 0.4, "high": 0.6, "half_width": 0.1})
    'not distinguishable from defaults (intervals overlap)'
    """
    widths = (a.get("half_width"), b.get("half_width"))
    if any(w is None or not math.isfinite(w) for w in widths):
        return f"not distinguishable from {name} (no interval: fewer than 2 seeds)"
    if a["low"] > b["high"]:
        return f"higher than {name} (intervals do not overlap)"
    if a["high"] < b["low"]:
        return f"lower than {name} (intervals do not overlap)"
    return f"not distinguishable from {name} (intervals overlap)"


def _window_mean(steps: list[dict], turn: str = "1") -> float:
    """Mean reward of `turn` over the last quarter of `steps` (at least one step)."""
    values = [s["turns"][turn] for s in steps if turn in s["turns"]]
    if not values:
        return math.nan
    tail = values[-max(1, len(values) // 4) :]
    return sum(tail) / len(tail)


def _steps_within(steps: list[dict], tokens: float) -> list[dict]:
    """The steps whose cumulative sampled tokens stay within `tokens` (at least the first)."""
    out, total = [], 0
    for s in steps:
        total += s["tokens"]
        if out and total > tokens:
            break
        out.append(s)
    return out


def _curve(runs: list[dict]) -> dict:
    """Mean over seeds, per step: each turn's training reward and the cumulative sampled tokens."""
    length = min(len(r["steps"]) for r in runs)
    curve = {"step": [], "tokens": [], **{t: [] for t in TURNS}}
    for i in range(length):
        curve["step"].append(i + 1)
        curve["tokens"].append(sum(sum(s["tokens"] for s in r["steps"][: i + 1]) for r in runs) / len(runs))
        for t in TURNS:
            vals = [r["steps"][i]["turns"].get(t) for r in runs]
            vals = [v for v in vals if v is not None]
            curve[t].append(sum(vals) / len(vals) if vals else math.nan)
    return curve


def summarize(results: list[dict], meta: dict) -> dict:
    methods: dict[str, list[dict]] = {}
    skipped: dict[str, str] = {}
    mechanisms = None
    for r in results:
        if r["kind"] == "mechanisms":
            mechanisms = r
        elif "skipped" in r:
            skipped[r["method"]] = r["skipped"]
        else:
            methods.setdefault(r["method"], []).append(r)
    out = {"meta": meta, "held_out_prompts": HELD_OUT, "training_prompts": TRAIN_PROMPTS, "methods": {},
           "comparisons": {}, "controls": {}, "skipped": skipped,
           "reward": f"{RATIO_WEIGHT} * length_ratio + {ON_TOPIC_WEIGHT} * mean over agents of on_topic (credit_task.py)"}  # fmt: skip
    for name in ORDER:
        runs = methods.get(name)
        if not runs:
            continue
        entry = {
            "seeds": [r["seed"] for r in runs],
            "held_out": {t: interval([r["eval"]["team"]["turns"][t] for r in runs]) for t in TURNS},
            "sampled_tokens": interval([r["sampled_tokens"] for r in runs]),
            "eval_sampled_tokens": interval([r["eval"]["team"]["sampled_tokens"] for r in runs]),
            "optimizer_steps": [r["optimizer_steps"] for r in runs],
            "wall_s": [r.get("wall_s") for r in runs],
        }
        for key in ("own_rewards_match", "optimizer_rates"):  # alpha_0.7's and agent_lr's own checks
            if key in runs[0]:
                entry[key] = [r[key] for r in runs]
        if name != "untrained":
            entry["train_turn1_last_quarter"] = interval([_window_mean(r["steps"]) for r in runs])
            entry["curve"] = _curve(runs)
            entry["grad_norm_median"] = interval([sorted(r["grad_norm"])[len(r["grad_norm"]) // 2] for r in runs])
        out["methods"][name] = entry
    base = out["methods"].get("defaults")
    if base:
        for name, entry in out["methods"].items():
            if name != "defaults":
                out["comparisons"][name] = {t: compare(entry["held_out"][t], base["held_out"][t]) for t in TURNS}
        best = methods.get("branching_best")
        if best:
            budget = out["methods"]["branching_best"]["sampled_tokens"]["mean"]
            at_budget = interval([_window_mean(_steps_within(r["steps"], budget)) for r in methods["defaults"]])
            own = out["methods"]["branching_best"]["train_turn1_last_quarter"]
            out["matched_tokens"] = {
                "tokens": budget,
                "branching_best_turn1": own,
                "defaults_turn1_at_same_tokens": at_budget,
                "line": "branching_best's training turn-1 reward (last quarter of its steps) is "
                + compare(own, at_budget, "defaults at the same sampled tokens"),
            }
        for control in ("role_swap", "best_of_n"):
            runs = [r for r in methods.get("defaults", []) if control in r["eval"]]
            if runs:
                entry = {t: interval([r["eval"][control]["turns"][t] for r in runs]) for t in TURNS}
                entry["sampled_tokens"] = interval([r["eval"][control]["sampled_tokens"] for r in runs])
                if control == "best_of_n":
                    entry["N"] = [r["eval"][control]["N"] for r in runs]
                entry["against_team"] = {
                    t: compare(entry[t], base["held_out"][t], "the trained team (defaults)") for t in TURNS
                }
                out["controls"][control] = entry
    untrained = [r for r in methods.get("untrained", []) if "best_of_n" in r["eval"]]
    if untrained:
        entry = {t: interval([r["eval"]["best_of_n"]["turns"][t] for r in untrained]) for t in TURNS}
        entry["sampled_tokens"] = interval([r["eval"]["best_of_n"]["sampled_tokens"] for r in untrained])
        entry["N"] = [r["eval"]["best_of_n"]["N"] for r in untrained]
        if base:
            entry["against_team"] = {
                t: compare(entry[t], base["held_out"][t], "the trained team (defaults)") for t in TURNS
            }
        out["controls"]["best_of_n_base_model"] = entry
    if mechanisms:
        out["mechanisms"] = summarize_mechanisms(mechanisms)
    return out


def summarize_mechanisms(m: dict) -> dict:
    scales = {}
    for mode, runs in m["reward_scales"].items():
        scales[mode] = {
            **{
                f"agent_{i}_{stat}": interval([r[f"agent_{i}"][stat] for r in runs])
                for i in (0, 1)
                for stat in ("max", "median")
            },  # fmt: skip
            "ratio_median_1_over_0": interval([r["ratio_median_1_over_0"] for r in runs]),
            "ratio_max_1_over_0": interval([r["ratio_max_1_over_0"] for r in runs]),
            "per_seed": runs,
        }
    branching = {}
    for mode, runs in m["branching_T3"].items():
        branching[mode] = {
            "optimizer_steps": [r["optimizer_steps"] for r in runs],
            "tokens_per_step": interval([r["tokens_per_step"] for r in runs]),
            "sampled_tokens": interval([r["sampled_tokens"] for r in runs]),
            "turn1_reward": interval([r["turn1_reward_mean"] for r in runs]),
            "turn1_reward_per_1k_tokens_per_step": interval([r["turn1_reward_per_1k_tokens"] for r in runs]),
            "train_s": interval([r["train_s"] for r in runs]),
            "per_seed": runs,
        }
    lines = {}
    if "all" in branching and "best" in branching:
        lines["turn1_reward"] = "best-only turn-1 reward is " + compare(
            branching["best"]["turn1_reward"], branching["all"]["turn1_reward"], "full expansion"
        )
    return {"reward_scales": scales, "branching_T3": branching, "lines": lines}


def pm(x: dict | None, digits: int = 3) -> str:
    if not x or x.get("mean") is None or not math.isfinite(x["mean"]):
        return "n/a"
    hw = x.get("half_width")
    if hw is None or not math.isfinite(hw):
        return f"{x['mean']:.{digits}f} (n={x['n']})"
    return f"{x['mean']:.{digits}f} ± {hw:.{digits}f}"


def markdown(s: dict) -> str:
    meta = s["meta"]
    lines = ["# Credit options of MAGRPO on the seed task (benchmarks/credit)", ""]
    lines += [
        f"Command: `{meta['command']}`",
        "",
        f"Date (UTC): {meta['date_utc']}; wall time {meta['wall_s']:.0f} s.",
    ]
    machine = meta["machine"]
    lines.append(f"Machine: {machine['platform']}, {machine['processor']}, {machine['cpus']} CPUs, "
                 f"{machine['torch_threads']} torch threads, python {machine['python']}; os.getloadavg() before "
                 f"{machine['load_before']}, after {machine['load_after']}.")  # fmt: skip
    st = meta["settings"]
    lines.append(f"Model: {meta['model']}; chat prompts {meta['chat_prompts']}; LoRA r={st['lora_r']}, learning rate "
                 f"{st['learning_rate']}; 2 agents, {st['num_turns']} turns, K={st['num_generations']}, "
                 f"{st['max_new_tokens']} new tokens, early termination {st['early_termination']}, one prompt per "
                 f"step; {meta['steps']} optimizer steps per trained method; seeds {meta['seeds']}.")  # fmt: skip
    lines.append(f"Team reward: {s['reward']}.")
    if meta.get("estimate"):
        lines.append(
            f"Estimated before starting: {meta['estimate']['total_s'] / 3600:.2f} h ({meta['estimate']['how']})."
        )
    lines += ["", f"Training prompts: {s['training_prompts']}.", f"Held-out prompts: {s['held_out_prompts']}.", ""]
    lines += ["## Held-out team reward", "",
              "Per seed: the mean over the 8 held-out prompts of each prompt's mean team reward at that turn "
              f"(evaluate_team, K={st['eval_generations']}, every joint answer continued, early termination off); "
              "mean over seeds ± 95% CI over seeds (Student t).", "",
              "| method | held-out turn 1 | held-out turn 2 | sampled tokens (training) | optimizer steps | seeds |",
              "|---|---|---|---|---|---|"]  # fmt: skip
    for name, e in s["methods"].items():
        steps = sorted(set(e["optimizer_steps"]))
        lines.append(f"| {name} | {pm(e['held_out']['1'])} | {pm(e['held_out']['2'])} | "
                     f"{pm(e['sampled_tokens'], 0)} | {', '.join(map(str, steps))} | {len(e['seeds'])} |")  # fmt: skip
    for name in s["skipped"]:
        lines.append(f"| {name} | skipped | skipped | - | - | 0 |")
    lines += ["", "### Compared with defaults (from the intervals only)", ""]
    for name, by_turn in s["comparisons"].items():
        for t, line in by_turn.items():
            lines.append(f"- {name}, held-out turn {t}: {line}.")
    for name, why in s["skipped"].items():
        lines.append(f"- {name}: skipped ({why}).")
    lines += ["", "## Reward against sampled tokens (training)", "",
              "Training turn-1 reward (which branching does not select) over the last quarter of the steps, mean over "
              "seeds ± 95% CI; plots: reward_vs_steps.png, reward_vs_tokens.png.", "",
              "| method | training turn-1 reward | sampled tokens | tokens per step | median grad norm |",
              "|---|---|---|---|---|"]  # fmt: skip
    for name, e in s["methods"].items():
        if name == "untrained":
            continue
        per_step = e["sampled_tokens"]["mean"] / max(max(e["optimizer_steps"]), 1)
        lines.append(f"| {name} | {pm(e['train_turn1_last_quarter'])} | {pm(e['sampled_tokens'], 0)} | "
                     f"{per_step:.0f} | {pm(e['grad_norm_median'], 4)} |")  # fmt: skip
    if "matched_tokens" in s:
        mt = s["matched_tokens"]
        lines += ["", f"At equal sampled tokens ({mt['tokens']:.0f}, branching_best's total): branching_best "
                  f"{pm(mt['branching_best_turn1'])}, defaults {pm(mt['defaults_turn1_at_same_tokens'])} (its steps "
                  f"within that many tokens, last quarter). {mt['line']}."]  # fmt: skip
    lines += [
        "",
        "## Controls",
        "",
        "| control | turn 1 | turn 2 | sampled tokens (evaluation) | N | seeds |",
        "|---|---|---|---|---|---|",
    ]
    titles = {"role_swap": "role swap (defaults team, seats exchanged)",
              "best_of_n": "best-of-N, agent 0 of the defaults team in every seat",
              "best_of_n_base_model": "best-of-N, base model in every seat"}  # fmt: skip
    for name, c in s["controls"].items():
        n = ", ".join(map(str, c.get("N", []))) or "-"
        lines.append(f"| {titles[name]} | {pm(c['1'])} | {pm(c['2'])} | {pm(c['sampled_tokens'], 0)} | {n} | "
                     f"{c['1']['n']} |")  # fmt: skip
    if "defaults" in s["methods"]:
        d = s["methods"]["defaults"]
        lines.append(f"| (the defaults team itself) | {pm(d['held_out']['1'])} | {pm(d['held_out']['2'])} | "
                     f"{pm(d['eval_sampled_tokens'], 0)} | - | {len(d['seeds'])} |")  # fmt: skip
    lines.append("")
    for name, c in s["controls"].items():
        for t, line in c.get("against_team", {}).items():
            lines.append(f"- {titles[name]}, turn {t}: {line}.")
    m = s.get("mechanisms")
    if m:
        lines += ["", "## Mechanism checks (tiny random models, credit_mechanisms.py)", "",
                  "(1) Own rewards 100x apart (agent 1's = 100 x agent 0's scale), alpha 0, one turn; per-agent "
                  "gradient L2 norm before each optimizer step (clipping off), max and median over steps; mean over "
                  "seeds ± 95% CI.", "",
                  "| scale_rewards | agent 0 max | agent 0 median | agent 1 max | agent 1 median | ratio of medians (1/0) |",
                  "|---|---|---|---|---|---|"]  # fmt: skip
        for mode, r in m["reward_scales"].items():
            lines.append(f"| {mode} | {pm(r['agent_0_max'], 4)} | {pm(r['agent_0_median'], 4)} | "
                         f"{pm(r['agent_1_max'], 4)} | {pm(r['agent_1_median'], 4)} | "
                         f"{pm(r['ratio_median_1_over_0'], 2)} |")  # fmt: skip
        lines += ["", "(2) Best-only branching against full expansion at T = 3 (K = 4, early termination off, same "
                  "optimizer steps); turn-1 training reward over all steps.", "",
                  "| branching | optimizer steps | sampled tokens per step | turn-1 reward | turn-1 reward per 1k tokens per step |",
                  "|---|---|---|---|---|"]  # fmt: skip
        for mode, r in m["branching_T3"].items():
            lines.append(f"| {mode} | {', '.join(map(str, sorted(set(r['optimizer_steps']))))} | "
                         f"{pm(r['tokens_per_step'], 0)} | {pm(r['turn1_reward'])} | "
                         f"{pm(r['turn1_reward_per_1k_tokens_per_step'])} |")  # fmt: skip
        for line in m["lines"].values():
            lines.append(f"\n- {line}.")
    return "\n".join(lines) + "\n"


def plots(s: dict, out: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    written = []
    for x_key, name, label in (("step", "reward_vs_steps.png", "optimizer step"),
                               ("tokens", "reward_vs_tokens.png", "sampled tokens (training, cumulative)")):  # fmt: skip
        figure, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
        for ax, t in zip(axes, TURNS, strict=True):
            for method, e in s["methods"].items():
                if "curve" in e:
                    ax.plot(e["curve"][x_key], e["curve"][t], "o-", markersize=3, label=method)
            ax.set_title(f"training turn-{t} reward (mean over seeds)" + (" - best: selected" if t == "2" else ""),
                         fontsize=9)  # fmt: skip
            ax.set_xlabel(label)
            ax.grid(True, alpha=0.3)
        axes[0].set_ylabel("team reward")
        axes[0].legend(fontsize=7)
        figure.tight_layout()
        path = os.path.join(out, name)
        figure.savefig(path)
        plt.close(figure)
        written.append(path)
    return written
