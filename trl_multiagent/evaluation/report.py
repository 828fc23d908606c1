"""The report: the markdown table (one row per run and turn), the text around it, and `evaluation.json` /
`evaluation.md` (NaN written as null)."""

from __future__ import annotations

import json
import math
import os

from .runs import UNTRAINED_FROM_BASE
from .statistics import CI_METHOD


RUN_TITLES = {"team": "team", "untrained": "untrained", "role_swap": "role swap", "best_of_n": "best-of-N, one agent"}
COLUMNS = ["run", "seats", "turn", "mean reward", "± 95% CI", "95% CI", "n", "sampled tokens", "joint answers/prompt"]


def _number(value: float, digits: int = 3) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def markdown_table(result: dict) -> str:
    """The table `evaluation.md` holds and the command prints: one row per run and turn."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for name, run in result["runs"].items():
        title = RUN_TITLES.get(name, name)
        if name == "best_of_n":
            title = f"best-of-{run['N']}, agent {run['single_agent']} alone"
        if name == "untrained":
            title = (
                "untrained: base, no adapters"
                if run["untrained"] == UNTRAINED_FROM_BASE
                else "untrained: initial models"
            )
        for turn, interval in run["turns"].items():
            ci = f"[{_number(interval['low'])}, {_number(interval['high'])}]"
            cells = [
                title,
                " ".join(str(s) for s in run["seats"]),
                turn,
                _number(interval["mean"]),
                _number(interval["half_width"]),
                ci,
                str(interval["n"]),
                str(run["sampled_tokens"]),
                f"{run['joint_answers_per_prompt'][turn]:g}",
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def report_text(result: dict) -> str:
    """The table and what it rests on: the folder, the task, the interval, and best-of-N's N and token counts."""
    s, task = result["settings"], result["task"]
    decoding = "greedy" if s["greedy"] else f"sampled, K={s['num_generations']} answers per agent and node"
    lines = [
        f"# Evaluation of {result['folder']}",
        "",
        f"{result['team']['num_agents']} agents ({result['team']['kind']}); task: reward `{task['reward']}`, "
        + (f"transition `{task['transition']}`, " if task["transition"] else "")
        + f"{task['num_prompts']} held-out prompts (`{task['prompts']}`); "
        f"{s['num_turns']} turn(s), {decoding}, {s['max_new_tokens']} new tokens, temperature {s['temperature']}, "
        f"seed {s['seed']}.",
        "",
        markdown_table(result),
        "",
        f"Unit: a held-out prompt (per prompt and turn, the mean joint reward of its joint answers at that turn). "
        f"Interval: {CI_METHOD}. Seats: the agent in each seat (role swap: seat i played by agent (i + 1) mod N).",
    ]
    untrained = result["runs"].get("untrained")
    if untrained is not None:
        lines.append(
            f"Untrained: {untrained['untrained']}, in seats {' '.join(str(s) for s in untrained['seats'])}: "
            f"{', '.join(untrained['models'])}. Did training help: compare the team's rows with these."
        )
    elif "untrained_skipped" in result:
        lines.append(f"Untrained: {result['untrained_skipped']}.")
    best = result["runs"].get("best_of_n")
    if best is not None:
        lines.append(
            f"Best-of-N: agent {best['single_agent']} in every seat, N = {best['N']} independent rollouts per prompt, "
            f"the best by final-turn reward; sampled tokens {best['sampled_tokens']} (team: "
            f"{best['team_sampled_tokens']}; one sample per prompt costs about {_number(best['tokens_per_sample'], 0)})."
        )
    return "\n".join(lines) + "\n"


def _strict(value):
    """NaN (an interval over fewer than 2 prompts) and infinities as JSON null, so that any JSON reader takes the file."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict(v) for v in value]
    return value


def write_report(result: dict, out: str) -> tuple[str, str]:
    """Write `out/evaluation.json` (NaN as null) and `out/evaluation.md`; returns their paths."""
    os.makedirs(out, exist_ok=True)
    json_path, md_path = os.path.join(out, "evaluation.json"), os.path.join(out, "evaluation.md")
    with open(json_path, "w") as file:
        json.dump(_strict(result), file, indent=2, allow_nan=False)
        file.write("\n")
    with open(md_path, "w") as file:
        file.write(report_text(result))
    return json_path, md_path
