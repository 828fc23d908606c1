"""A run folder's recorded rollout trees (`MAGRPOConfig(log_rollout_trees=True)`) as one self-contained HTML page:
the styles, the script and every recorded step inline (no CDN, no network), the reward curve from the run's
`trainer_state.json` (or, without one, from the trees themselves)."""

from __future__ import annotations

import glob
import html
import json
import os
from pathlib import Path

from ..trees import read_step, step_files


HERE = Path(__file__).resolve().parent
PAGE_NAME = "rollout_trees.html"
# The curve's series, from `trainer_state.json`'s log_history: TRL's `reward` and each turn's mean
CURVE_KEYS = ("reward",)


class ViewError(ValueError):
    """A run folder the viewer cannot show (the command prints it and exits with status 2)."""


def _json_for_script(value) -> str:
    """JSON that cannot close its <script> tag: every "<" (only ever inside a string) written as \\u003c."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False).replace("<", "\\u003c")


def trainer_state(run_dir: str) -> dict | None:
    """The newest `trainer_state.json`: the run folder's own (`trainer.save_state()`), else its newest checkpoint's."""
    own = os.path.join(run_dir, "trainer_state.json")
    candidates = [own] if os.path.isfile(own) else []
    checkpoints = glob.glob(os.path.join(run_dir, "checkpoint-*", "trainer_state.json"))
    candidates += sorted(
        checkpoints, key=lambda p: int(p.split("checkpoint-")[-1].split(os.sep)[0] or 0), reverse=True
    )
    for path in candidates:
        with open(path) as f:
            return json.load(f)
    return None


def reward_curve(run_dir: str, documents: dict[int, dict]) -> dict:
    """``{"source": ..., "series": {name: [[step, value], ...]}}``: `reward` and `turn_{t}/reward_mean` per logged
    step from trainer_state.json's log_history; without it, each recorded step's mean joint reward per turn."""
    state = trainer_state(run_dir)
    series: dict[str, list] = {}
    if state is not None:
        for entry in state.get("log_history", []):
            for key, value in entry.items():
                if (
                    key in CURVE_KEYS or (key.startswith("turn_") and key.endswith("/reward_mean"))
                ) and "step" in entry:
                    if isinstance(value, (int, float)):
                        series.setdefault(key, []).append([entry["step"], value])
        if series:
            return {"source": "trainer_state.json (log_history)", "series": series}
    for step, document in documents.items():
        by_turn: dict[int, list[float]] = {}
        for prompt in document["prompts"]:
            for node in prompt["nodes"]:
                by_turn.setdefault(node["turn"], []).extend(
                    a["reward"] for a in node["actions"] if a["reward"] is not None
                )
        for turn, rewards in sorted(by_turn.items()):
            if rewards:
                series.setdefault(f"turn_{turn}/reward_mean", []).append([step, sum(rewards) / len(rewards)])
    return {"source": "the recorded trees (no trainer_state.json yet)", "series": series}


def page_html(run_dir: str, steps: list[int] | None = None) -> str:
    """The page for `run_dir` (its `rollout_trees/`), every recorded step or only `steps`."""
    files = step_files(run_dir)
    if not files:
        raise ViewError(
            f"{run_dir}: no recorded rollout trees (no {os.path.join(run_dir, 'rollout_trees', 'step_*.json.gz')}). "
            "Train with MAGRPOConfig(log_rollout_trees=True) (a recipe flag: --log_rollout_trees true)."
        )
    if steps is not None:
        missing = sorted(set(steps) - set(files))
        if missing:
            raise ViewError(f"{run_dir}: no recorded tree for step(s) {missing}; recorded: {list(files)}.")
        files = {s: files[s] for s in sorted(steps)}
    documents = {step: read_step(path) for step, path in files.items()}
    index = {"run": os.path.abspath(run_dir), "steps": list(documents), "curve": reward_curve(run_dir, documents)}
    data = "\n".join(
        f'<script type="application/json" id="step-{step}">{_json_for_script(doc)}</script>'
        for step, doc in documents.items()
    )
    title = html.escape(os.path.basename(os.path.abspath(run_dir)) or run_dir)
    return TEMPLATE.format(
        title=title,
        css=(HERE / "viewer.css").read_text(),
        js=(HERE / "viewer.js").read_text(),
        index=_json_for_script(index),
        data=data,
    )


def write_page(run_dir: str, out: str | None = None, steps: list[int] | None = None) -> str:
    """Write the page (by default `<run_dir>/rollout_trees.html`) and return its path."""
    out = out or os.path.join(run_dir, PAGE_NAME)
    text = page_html(run_dir, steps)
    with open(out, "w", encoding="utf-8") as f:
        f.write(text)
    return out


TEMPLATE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>Rollout trees · {title}</title>
<style>
{css}</style></head>
<body>
<header><h1>Rollout trees · {title}</h1>
<label>Step <select id="step"></select></label>
<label>Prompt <select id="prompt"></select></label>
<label>Colour by <select id="measure"><option value="reward">mean joint reward</option>
<option value="return">mean return</option></select></label>
<span class="legend" id="colourscale"><span id="measurename"></span> <span id="lo"></span>
<span class="bar" style="background: linear-gradient(90deg, rgb(215,48,39), rgb(254,224,139), rgb(26,152,80))"></span>
<span id="hi"></span></span></header>
<div id="top">
<div id="treebox"><svg id="tree" xmlns="http://www.w3.org/2000/svg"></svg></div>
<div id="side">
<div class="card"><h2>Reward per step <span class="muted" id="curvesource"></span></h2>
<svg id="curve" width="356" height="190" xmlns="http://www.w3.org/2000/svg"></svg>
<div id="curvelegend"></div><div class="muted">Click a point to open that step's trees.</div></div>
<div class="card"><h2>This step, per turn (every prompt)</h2><table id="turns"></table></div>
<div class="card" id="legend"><h2>How to read the tree</h2><ul>
<li id="legend-colour"><b>Colours</b>: a circle (a node) by the mean over its joint actions, a square under it (one
joint action) by its own value, of what <i>Colour by</i> picks: red the step's lowest, yellow the middle, green the
highest (the scale in the header); grey: no value. Under each node, <i>rew</i> its mean joint reward and <i>ret</i> its
mean return.</li>
<li id="legend-return"><b>Return</b> = reward + discount (<span id="discount"></span>) &times; the mean return of the
joint actions of the node it continued into; a joint action that nothing continued has its reward as its return. An early turn's return adds up the
rewards still to come, so with rewards up to 1 a turn-1 return can come close to the number of turns.</li>
<li id="legend-action"><b>joint action j (a, b)</b>: the node's j-th joint action, made of completion a of agent 0,
completion b of agent 1 (one index per agent; each agent writes K completions at a node).</li>
<li id="legend-ended"><b>Dashed ring</b>: the node ended early: before the last turn, its mean joint reward was above
early_termination_threshold (<span id="threshold"></span>), so no turn followed it. A faded square: a joint action
that <i>branching</i> did not continue.</li></ul></div>
</div></div>
<div id="panel"></div>
<script type="application/json" id="index">{index}</script>
{data}
<script>
{js}</script>
</body></html>
"""
