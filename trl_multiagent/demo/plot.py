"""Reward and length curves of a MAGRPO run, from its logged history.

    python -m trl_multiagent.plot outputs/length_ratio               # writes outputs/length_ratio/rewards.png
    python -m trl_multiagent.plot outputs/length_ratio --out curves.png

or, in Python, `plot_run(trainer.state.log_history, "curves.png")`.

The figure has two panels: `turn_{t}/reward_mean` for every turn t (shaded by `turn_{t}/reward_std` when logged), and
`agent_{i}/completions/mean_length` for every agent i, both over training steps; a run whose agents had tools gets a
third, `turn_1/agent_{i}/tools/call_frequency` (tool calls per completion in the first turn). Per-step values are drawn as points;
from `SMOOTH_FROM` steps on, a centred moving average over about an eighth of the run is drawn through them, so the
trend shows through the step-to-step noise. Needs matplotlib (the `demo` or `plot` extra); it draws with the Agg
backend and leaves pyplot's global backend alone.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from .summary import AGENT_LENGTH, AGENT_TOOL_CALLS, TURN_REWARD, series, smooth, summary_lines


TRAINER_STATE = "trainer_state.json"
SMOOTH_FROM = 8  # steps; a shorter run is drawn as its points only
FIGSIZE = (11.0, 4.0)  # inches
DPI = 100  # so the PNG is 1100 x 400 pixels


def find_trainer_state(run_dir: str | os.PathLike) -> Path:
    """The newest `trainer_state.json` in `run_dir` or its `checkpoint-*` folders: the last written (then the one with
    the highest global_step), so a stale checkpoint of an earlier, longer run in the same folder is not taken."""
    run_dir = Path(run_dir)
    if run_dir.is_file():
        return run_dir
    if not run_dir.is_dir():
        raise FileNotFoundError(f"plot_run: {run_dir} is not a folder or a {TRAINER_STATE} file.")
    candidates = [run_dir / TRAINER_STATE, *run_dir.glob(f"checkpoint-*/{TRAINER_STATE}")]
    candidates = [c for c in candidates if c.is_file()]
    if not candidates:
        raise FileNotFoundError(
            f"plot_run: no {TRAINER_STATE} in {run_dir} or its checkpoint-* folders. It is written by "
            "`trainer.save_state()` (the recipes call it) and into every checkpoint."
        )

    def rank(path: Path) -> tuple[float, int]:
        try:
            step = int(json.loads(path.read_text()).get("global_step") or 0)
        except (OSError, ValueError):
            step = -1
        return path.stat().st_mtime, step

    return max(candidates, key=rank)


def load_log_history(run_dir: str | os.PathLike) -> list[dict]:
    path = find_trainer_state(run_dir)
    try:
        state = json.loads(path.read_text())
    except ValueError as error:
        raise ValueError(f"plot_run: {path} is not valid JSON: {error}") from error
    history = state.get("log_history")
    if not isinstance(history, list):
        raise ValueError(f"plot_run: {path} has no `log_history` list.")
    return history


def last_logged(log_history: list[dict], key: str) -> float | None:
    """The last value of `key` in a log history, or None if it was never logged."""
    for entry in reversed(log_history):
        if key in entry:
            return entry[key]
    return None


def _std(log_history: list[dict], turn: int, steps: list) -> list[float] | None:
    by_step = {e.get("step"): e.get(f"turn_{turn}/reward_std") for e in log_history if f"turn_{turn}/reward_mean" in e}
    stds = [by_step.get(s) for s in steps]
    return None if any(not isinstance(s, (int, float)) for s in stds) else [float(s) for s in stds]


def _points_and_trend(ax, steps: list, values: list[float], label: str):
    """The per-step values as points, and from SMOOTH_FROM steps on their moving average as a line."""
    if len(values) < SMOOTH_FROM:
        (line,) = ax.plot(steps, values, marker="o", markersize=3, label=label)
        return line
    (line,) = ax.plot(steps, values, "o", markersize=3, alpha=0.45, label=f"{label} (per step)")
    window = max(3, len(values) // 8) | 1  # odd, so the average is centred on its step
    ax.plot(
        steps,
        smooth(values, window),
        "-",
        linewidth=2,
        color=line.get_color(),
        label=f"{label} ({window}-step moving average)",
    )
    return line


def plot_run(
    run_dir_or_log_history: str | os.PathLike | list[dict],
    out_png: str | os.PathLike | None = None,
    title: str | None = None,
) -> str:
    """Draw the per-turn rewards and per-agent completion lengths of a run into a PNG and return its path.

    Args:
        run_dir_or_log_history: a run's output folder (its newest `trainer_state.json` is read, searching the
            `checkpoint-*` folders too), a `trainer_state.json` file, or a `log_history` list
            (`trainer.state.log_history`).
        out_png: where to write the PNG. Defaults to `<run_dir>/rewards.png`; needed when a list is passed.
        title: the figure's title (default: the run folder's name).
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator
    except ImportError as error:
        raise ImportError(
            'plot_run needs matplotlib: pip install matplotlib, or the extra: pip install -e ".[demo]".'
        ) from error

    if isinstance(run_dir_or_log_history, (list, tuple)):
        log_history, default_title = list(run_dir_or_log_history), "MAGRPO run"
        if out_png is None:
            raise ValueError("plot_run: pass `out_png` when giving a log_history list.")
    else:
        source = Path(run_dir_or_log_history)
        log_history = load_log_history(source)
        run_dir = source.parent if source.is_file() else source
        default_title = run_dir.resolve().name
        if out_png is None:
            out_png = run_dir / "rewards.png"

    turns = series(log_history, TURN_REWARD)
    agents = series(log_history, AGENT_LENGTH)
    if not turns and not agents:
        keys = sorted({k for e in log_history for k in e})
        raise ValueError(
            "plot_run: the log has no `turn_{t}/reward_mean` or `agent_{i}/completions/mean_length` values "
            f"({len(log_history)} entries; keys: {keys[:20]}{' ...' if len(keys) > 20 else ''}). Is it a "
            "MAGRPOTrainer run with logging_steps set?"
        )

    tools = series(log_history, AGENT_TOOL_CALLS)
    figure = Figure(figsize=(FIGSIZE[0] * (1.5 if tools else 1), FIGSIZE[1]), dpi=DPI)
    FigureCanvasAgg(figure)
    reward_ax, length_ax, *tools_ax = figure.subplots(1, 3 if tools else 2)
    for turn, (steps, values) in turns.items():
        line = _points_and_trend(reward_ax, steps, values, f"turn {turn}")
        std = _std(log_history, turn, steps)
        if std is not None:
            low = [v - s for v, s in zip(values, std, strict=True)]
            high = [v + s for v, s in zip(values, std, strict=True)]
            reward_ax.fill_between(steps, low, high, color=line.get_color(), alpha=0.1, linewidth=0)
    for agent, (steps, values) in agents.items():
        _points_and_trend(length_ax, steps, values, f"agent {agent}")
    for agent, (steps, values) in tools.items():
        _points_and_trend(tools_ax[0], steps, values, f"agent {agent}")

    panels = [
        (reward_ax, turns, "turn_t/reward_mean (shaded: ± turn_t/reward_std)", "joint reward"),
        (length_ax, agents, "agent_i/completions/mean_length", "tokens"),
    ]
    if tools:
        panels.append((tools_ax[0], tools, "turn_1/agent_i/tools/call_frequency", "tool calls per completion"))
    for ax, data, heading, ylabel in panels:
        ax.set_title(heading, fontsize=10)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(True, alpha=0.3)
        if data:
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes, color="gray")
    figure.suptitle(title if title is not None else default_title, fontsize=11)
    figure.tight_layout()

    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out_png, format="png")
    return str(out_png)


def run_report(trainer, samples) -> list[str]:
    """What a tools recipe prints at its end: the summary of the logged steps, the sample answers, and where the
    reward and tool-call curves were written (`output_dir/rewards.png`; or why there are none)."""
    history = trainer.state.log_history
    lines = [*summary_lines(history), *samples.lines()]
    try:
        png = plot_run(history, os.path.join(trainer.args.output_dir, "rewards.png"))
        lines.append(f"Reward and tool-call curves: {png}")
    except (ImportError, ValueError) as error:
        lines.append(f"No curves: {error}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trl_multiagent.plot",
        description="Plot turn_t/reward_mean and agent_i/completions/mean_length of a MAGRPO run.",
    )
    parser.add_argument("run_dir", help=f"The run's output folder (or a {TRAINER_STATE} file).")
    parser.add_argument("--out", default=None, help="PNG to write (default: RUN_DIR/rewards.png).")
    args = parser.parse_args(argv)
    try:
        path = plot_run(args.run_dir, args.out)
    except (FileNotFoundError, ValueError, ImportError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
