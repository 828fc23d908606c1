"""Merging the parts' result files into one report: per task, a table of every side before and after training, a
plain verdict (team against the single agent), and a plot.

Statistics. Per seed, a side's held-out score is the mean over held-out rows of each row's value (the mean reward of
its sampled final answers), with a 95% Student-t interval over the rows. Across seeds, the side's score is the mean
of the seed means, with their standard deviation (the spread; summary.json also holds a 95% t interval over the
seeds, `mean_ci`).

The verdict compares the team's trained score with the single agent's, over seeds: the difference of the seed means,
with a 95% interval from the two sides' standard errors over seeds (Welch's, conservatively with the smaller side's
n - 1 degrees of freedom). With one seed on either side there is no spread over seeds; the verdict then uses the
paired per-row differences of that seed (both sides answer the same held-out rows), and says that it is one seed.
"""

from __future__ import annotations

import glob
import json
import math
import os

from trl_multiagent.evaluation import mean_ci, t_quantile

from .sides import SIDE_NOTES, SIDES


def read_parts(results: str) -> dict:
    """{task: {side: [result, ...] sorted by seed}} from `results/<task>/<side>/seed<k>.json`."""
    parts = {}
    for path in sorted(glob.glob(os.path.join(results, "*", "*", "seed*.json"))):
        with open(path) as f:
            result = json.load(f)
        parts.setdefault(result["task"], {}).setdefault(result["side"], []).append(result)
    for sides in parts.values():
        for results_ in sides.values():
            results_.sort(key=lambda r: r["seed"])
    return parts


def last_quarter_reward(curve: list[dict]) -> float:
    """Mean training reward of the final turn over the last quarter of the run's generated tokens (the learning-rate
    rule's score)."""
    final_turn = max(p["turn"] for p in curve)
    total = curve[-1]["tokens"]
    last = [p["reward"] for p in curve if p["turn"] == final_turn and p["tokens"] >= 0.75 * total]
    return sum(last) / len(last)


def read_tries(results: str, task: str) -> dict:
    """{side: [try result, ...] sorted by rate} from `results/<task>/lr_tries/<side>/lr*_seed*.json`."""
    tries = {}
    for path in sorted(glob.glob(os.path.join(results, task, "lr_tries", "*", "lr*_seed*.json"))):
        with open(path) as f:
            result = json.load(f)
        tries.setdefault(result["side"], []).append(result)
    for results_ in tries.values():
        results_.sort(key=lambda r: (r["seed"], r["learning_rate"]))
    return tries


def seed_score(values: list[float]) -> dict:
    interval = mean_ci(values)
    return {"mean": interval.mean, "ci95": interval.half_width, "n": interval.n}


def over_seeds(means: list[float]) -> dict:
    interval = mean_ci(means)
    return {"mean": interval.mean, "sd": interval.sd, "ci95": interval.half_width, "seeds": interval.n}


def summarize_side(results: list[dict]) -> dict:
    """Per seed: before/after scores (and the per-turn extras); over seeds: the means' mean and spread; the budget."""
    out = {"seeds": [r["seed"] for r in results], "learning_rate": sorted({r["learning_rate"] for r in results}),
           "generated_tokens": [r["generated_tokens"] for r in results], "steps": [r["steps"] for r in results],
           "train_s": [r["train_s"] for r in results], "trainer": results[0]["trainer"],
           "train_cpu_s": [r.get("train_cpu_s") for r in results],  # parts run before it was recorded lack it
           "load_average": [(r["load_average_before"][0], r["load_average_after"][0]) for r in results],
           "learning_rate_rule": sorted({r.get("learning_rate_rule") or "not recorded" for r in results}),
           "eval_s": [(r["eval_before_s"], r["eval_after_s"]) for r in results],
           "part_s": [r["eval_before_s"] + r["train_s"] + r["eval_after_s"] for r in results]}  # fmt: skip
    for phase in ("before", "after"):
        per_seed = [{key: seed_score(values) for key, values in r[phase].items()} for r in results]
        out[phase] = {"per_seed": per_seed,
                      "over_seeds": {key: over_seeds([s[key]["mean"] for s in per_seed]) for key in per_seed[0]}}  # fmt: skip
    gains = [a["final"]["mean"] - b["final"]["mean"]
             for a, b in zip(out["after"]["per_seed"], out["before"]["per_seed"], strict=True)]  # fmt: skip
    out["gain"] = over_seeds(gains)
    # per seed, after minus before paired over the held-out rows (both evaluations answer the same rows)
    out["gain_per_seed"] = [seed_score([a - b for a, b in zip(r["after"]["final"], r["before"]["final"], strict=True)])
                            for r in results]  # fmt: skip
    return out


def compare(team: list[dict], other: list[dict], summary_team: dict, summary_other: dict, phase: str = "after",
            other_name: str = "single") -> dict:  # fmt: skip
    """The team's final score minus the other side's (`phase`: trained, or before training), with a 95% interval and
    a verdict."""
    a, b = summary_team[phase]["over_seeds"]["final"], summary_other[phase]["over_seeds"]["final"]
    diff = a["mean"] - b["mean"]
    shared = sorted({r["seed"] for r in team} & {r["seed"] for r in other})
    # per seed both sides answer the same held-out rows: the difference paired over rows, beside the verdict
    per_seed = []
    for seed in shared:
        t_rows = next(r for r in team if r["seed"] == seed)[phase]["final"]
        s_rows = next(r for r in other if r["seed"] == seed)[phase]["final"]
        paired = mean_ci([x - y for x, y in zip(t_rows, s_rows, strict=True)])
        per_seed.append({"seed": seed, "difference": paired.mean, "ci95": paired.half_width, "rows": paired.n})
    if a["seeds"] >= 2 and b["seeds"] >= 2:
        se = math.sqrt(a["sd"] ** 2 / a["seeds"] + b["sd"] ** 2 / b["seeds"])
        half = t_quantile(0.975, min(a["seeds"], b["seeds"]) - 1) * se
        basis = f"over seeds ({a['seeds']} team, {b['seeds']} {other_name})"
    elif not shared:
        return {"difference": diff, "ci95": math.nan, "verdict": "not comparable (no seed run on both sides)",
                "basis": "none", "per_seed": []}  # fmt: skip
    else:
        first = per_seed[0]
        diff, half = first["difference"], first["ci95"]
        basis = f"one seed ({first['seed']}) only: paired over {first['rows']} held-out rows, no spread over seeds"
    if math.isnan(half):
        verdict = "cannot tell (no interval)"
    elif diff == 0 and half == 0:
        verdict = "equal (the same score on every held-out row)"
    elif diff - half > 0:
        verdict = "the team wins"
    elif diff + half < 0:
        verdict = "the team loses"
    else:
        verdict = "within the noise"
    return {"difference": diff, "ci95": half, "verdict": verdict, "basis": basis, "per_seed": per_seed}


def summarize(results_dir: str) -> dict:
    parts = read_parts(results_dir)
    out = {}
    for task in [t for t in SIDES if t in parts]:
        sides = parts[task]
        summaries = {side: summarize_side(sides[side]) for side in SIDES[task] if side in sides}
        entry = {"sides": summaries}
        for other in ("single", "revise"):
            if "team" in sides and other in sides:
                entry[f"team_vs_{other}"] = {
                    phase: compare(sides["team"], sides[other], summaries["team"], summaries[other], phase, other)
                    for phase in ("after", "before")
                }
        tries = read_tries(results_dir, task)
        if tries:
            entry["lr_tries"] = {side: [{"learning_rate": t["learning_rate"], "seed": t["seed"], "steps": t["steps"],
                                         "generated_tokens": t["generated_tokens"], "train_s": t["train_s"],
                                         "last_quarter_reward": last_quarter_reward(t["curve"])} for t in tries[side]]
                                 for side in SIDES[task] if side in tries}  # fmt: skip
        settings_path = os.path.join(results_dir, task, "settings.json")
        if os.path.exists(settings_path):
            with open(settings_path) as f:
                entry["settings"] = json.load(f)
        out[task] = entry
    return out


def fmt(score: dict, spread_key: str = "sd") -> str:
    if math.isnan(score.get(spread_key, math.nan)):
        return f"{score['mean']:.3f}"
    return f"{score['mean']:.3f} (sd {score[spread_key]:.3f})" if spread_key == "sd" else \
        f"{score['mean']:.3f} ± {score[spread_key]:.3f}"  # fmt: skip


def seed_cells(per_seed: list[dict], key: str = "final") -> str:
    return "; ".join(f"{s[key]['mean']:.3f} ± {s[key]['ci95']:.3f}" for s in per_seed)


def task_table(task: str, entry: dict) -> list[str]:
    lines = ["| side | trainer | seeds | learning rate | steps | generated tokens | train s | train CPU s | "
             "before: seed means "
             "(95% CI over rows) | after: seed means (95% CI over rows) | after - before per seed (paired, 95% CI) | "
             "before, over seeds | after, over seeds | after - before, over seeds |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for side, s in entry["sides"].items():
        lr = ", ".join(f"{x:g}" for x in s["learning_rate"])
        lines.append(
            f"| {side} | {s['trainer']} | {', '.join(map(str, s['seeds']))} | {lr} | "
            f"{', '.join(map(str, s['steps']))} | {', '.join(map(str, s['generated_tokens']))} | "
            f"{', '.join(f'{x:.0f}' for x in s['train_s'])} | "
            f"{', '.join('n/a' if x is None else f'{x:.0f}' for x in s['train_cpu_s'])} | "
            f"{seed_cells(s['before']['per_seed'])} | "
            f"{seed_cells(s['after']['per_seed'])} | {seed_cells([{'final': g} for g in s['gain_per_seed']])} | "
            f"{fmt(s['before']['over_seeds']['final'])} | "
            f"{fmt(s['after']['over_seeds']['final'])} | {fmt(s['gain'])} |"
        )
    extras = []
    for side, s in entry["sides"].items():
        extras.append(f"- {side}: per seed, the 1-minute load average at the start and the end of the run: "
                      + ", ".join(f"{a:.1f} -> {b:.1f}" for a, b in s["load_average"])
                      + "; held-out evaluation s before / after: "
                      + ", ".join(f"{a:.0f} / {b:.0f}" for a, b in s["eval_s"])
                      + "; the whole part (evaluations and training) s: "
                      + ", ".join(f"{x:.0f}" for x in s["part_s"])
                      + "; learning rate: " + " / ".join(s["learning_rate_rule"]))  # fmt: skip
        for key in s["after"]["over_seeds"]:
            if key != "final":
                extras.append(f"- {side}, `{key}`: before {fmt(s['before']['over_seeds'][key])}, after "
                              f"{fmt(s['after']['over_seeds'][key])}")  # fmt: skip
    return lines + ([""] + extras if extras else [])


def tries_table(entry: dict) -> list[str]:
    """Each side's learning-rate tries: the rule's score per rate (steps, seconds), and the rate its parts used."""
    rates = sorted({t["learning_rate"] for tries in entry["lr_tries"].values() for t in tries})
    lines = ["Learning-rate tries (the rule: the highest mean training reward of the final turn over the last quarter "
             "of a try's generated tokens; tries on their own seed, no held-out rows):", "",
             "| side | " + " | ".join(f"lr {r:g}: reward (steps, s)" for r in rates) + " | parts' rate |",
             "|---|" + "---|" * (len(rates) + 1)]  # fmt: skip
    for side, tries in entry["lr_tries"].items():
        by_rate = {t["learning_rate"]: t for t in tries}
        cells = [f"{by_rate[r]['last_quarter_reward']:.3f} ({by_rate[r]['steps']}, {by_rate[r]['train_s']:.0f})"
                 if r in by_rate else "not tried" for r in rates]  # fmt: skip
        used = entry["sides"].get(side, {}).get("learning_rate")
        lines.append(
            f"| {side} | " + " | ".join(cells) + f" | {', '.join(f'{x:g}' for x in used) if used else 'no part yet'} |"
        )
    return lines


def verdict_line(name: str, comparison: dict) -> str:
    """The trained comparison's verdict, and the untrained one's beside it: a lead the team had before training
    is the task's structure, not what training did."""

    def difference(c):
        return f"{c['difference']:+.3f}" + ("" if math.isnan(c["ci95"]) else f" ± {c['ci95']:.3f}")

    after, before = comparison["after"], comparison["before"]
    line = (f"- **{name}: {after['verdict']}** at this budget: after training, team minus other "
            f"{difference(after)} (95%; {after['basis']}); before training {difference(before)} "
            f"({before['verdict']}).")  # fmt: skip
    if len(after["per_seed"]) > 1:
        line += (
            " Per seed after training, paired over the held-out rows: "
            + "; ".join(f"seed {c['seed']} {difference(c)}" for c in after["per_seed"])
            + "."
        )
    return line


def machines_line(results_dir: str) -> str:
    """Where the parts and tries ran, each distinct machine, library set and thread count with how many runs."""
    runs = {}
    for path in glob.glob(os.path.join(results_dir, "*", "**", "*seed*.json"), recursive=True):
        with open(path) as f:
            result = json.load(f)
        where = (result.get("machine", "machine not recorded"), result.get("versions", "versions not recorded"),
                 result.get("torch_threads"))  # fmt: skip
        runs[where] = runs.get(where, 0) + 1
    described = [f"{m}; {v}; {t} torch thread(s) per run ({n} runs)" for (m, v, t), n in sorted(runs.items(), key=str)]
    return (
        "Where the runs (parts and learning-rate tries) ran: " + " | ".join(described) + ". A machine may be shared: "
        "each run's 1-minute load average at its start and end is below its table (a load above the CPU count means "
        "the run had less than its core, and its seconds are inflated)."
    )


def report_text(summary: dict, header: list[str]) -> str:
    lines = ["# Team vs single agent", "", *header, ""]
    for task, entry in summary.items():
        lines += [f"## {task}", ""]
        if "settings" in entry:
            lines.append("Settings: " + ", ".join(f"{k} {v}" for k, v in entry["settings"].items()) + ".")
            lines.append("")
        lines += [f"- `{side}`: {SIDE_NOTES[task, side]}." for side in SIDES[task]] + [""]
        lines += task_table(task, entry)
        lines.append("")
        if "lr_tries" in entry:
            lines += tries_table(entry) + [""]
        if "team_vs_single" in entry:
            lines.append(verdict_line("team vs single agent", entry["team_vs_single"]))
        if "team_vs_revise" in entry:
            lines.append(verdict_line("team vs one agent over two turns", entry["team_vs_revise"]))
        missing = [side for side in SIDES[task] if side not in entry["sides"]]
        if missing:
            lines.append(f"- Not run: {', '.join(missing)}.")
        lines.append(f"- Plot: `{task}.png`.")
        lines.append("")
    return "\n".join(lines)


def plot_task(task: str, results: dict, out_png: str) -> str:
    """Left: each run's training reward (final turn) against generated tokens, binned; right: held-out scores before
    and after, per seed (dots, with 95% intervals over rows) and over seeds (bars)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(11.0, 4.2), dpi=100)
    FigureCanvasAgg(figure)
    curves, scores = figure.subplots(1, 2)
    colors = {"single": "tab:orange", "revise": "tab:green", "team": "tab:blue"}
    sides = [side for side in SIDES[task] if side in results]
    for side in sides:
        for i, r in enumerate(results[side]):
            final_turn = max(point["turn"] for point in r["curve"])
            points = [p for p in r["curve"] if p["turn"] == final_turn]
            window = max(1, len(points) // 10)
            xs = [points[min(j + window, len(points)) - 1]["tokens"] for j in range(0, len(points), window)]
            ys = [sum(p["reward"] for p in points[j : j + window]) / len(points[j : j + window])
                  for j in range(0, len(points), window)]  # fmt: skip
            curves.plot(xs, ys, "-", color=colors[side], alpha=0.8, label=side if i == 0 else None)
    curves.set_xlabel("generated tokens")
    curves.set_ylabel("training reward (final turn)")
    title = f"{task}: training reward per run (one line per seed)"
    if any(p["turn"] > 1 for side in sides for r in results[side] for p in r["curve"]):
        # in training, turn 2 continues each prompt's best first answer (by the reward); evaluation continues every one
        title += "\nturn 2 of two-turn sides: after the best first answer (best-only branching)"
    curves.set_title(title, fontsize=10)
    curves.set_ylim(0, 1)  # every reward of both tasks lies in [0, 1]
    curves.grid(True, alpha=0.3)
    curves.legend(fontsize=8)
    for k, side in enumerate(sides):
        for phase, offset in (("before", -0.18), ("after", 0.18)):
            per_seed = [seed_score(r[phase]["final"]) for r in results[side]]
            x = k + offset
            seed_means = [s["mean"] for s in per_seed]
            scores.bar(x, sum(seed_means) / len(seed_means), width=0.34, color=colors[side],
                       alpha=0.35 if phase == "before" else 0.8, label=f"{side} {phase}")  # fmt: skip
            for s in per_seed:
                half = 0.0 if math.isnan(s["ci95"]) else s["ci95"]
                scores.errorbar(x, s["mean"], yerr=half, fmt="o", color="black", markersize=3, capsize=2)
    scores.set_xticks(range(len(sides)), sides)
    scores.set_ylabel("held-out score (final answers)")
    scores.set_title("held-out: before (light), after (dark); dots: seeds, 95% CI", fontsize=10)
    scores.set_ylim(0, 1)
    scores.grid(True, axis="y", alpha=0.3)
    figure.tight_layout()
    figure.savefig(out_png, format="png")
    return out_png


def write_report(results_dir: str) -> tuple[str, dict]:
    """`report.md`, `summary.json` and one `<task>.png` per task, in `results_dir`."""
    summary = summarize(results_dir)
    with open(os.path.join(results_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    parts = read_parts(results_dir)
    for task in summary:
        try:
            plot_task(task, parts[task], os.path.join(results_dir, f"{task}.png"))
        except ImportError:
            print("team_vs_single: no plots (matplotlib is missing: pip install matplotlib).")
    path = os.path.join(results_dir, "report.md")
    with open(path, "w") as f:
        f.write(report_text(summary, [machines_line(results_dir)]))
    return path, summary
