"""Does a team beat one agent? The comparison, run in parts and merged into one report.

    python -m benchmarks.team_vs_single --screen                          # the arithmetic task's screen
    python -m benchmarks.team_vs_single                                   # everything: tries, 3 seeds, report
    python -m benchmarks.team_vs_single --tasks writing --tries_only      # the learning-rate tries only
    python -m benchmarks.team_vs_single --tasks writing --sides single team --seeds 0   # one part ...
    python -m benchmarks.team_vs_single --tasks arithmetic --seeds 1 2                  # ... or several
    python -m benchmarks.team_vs_single --report_only                     # merge what the results folder holds
    python -m benchmarks.team_vs_single --smoke --results /tmp/tvs        # a tiny random model, seconds (the test)

Run from the repository root. A part is one (task, side, seed): it evaluates the untrained model on the held-out rows
by the side's protocol, trains the side until its generated tokens reach `--token_budget`, evaluates again, and
writes `<results>/<task>/<side>/seed<k>.json`. A part whose file exists is skipped (`--overwrite` reruns it). Every
run ends by merging all parts in the folder into `report.md`, `summary.json` and `<task>.png`. The settings that
make parts comparable (model, budget, tokens, held-out samples, the arithmetic kind) are written once per task to
`<task>/settings.json`, and a part with other settings is refused.

Learning rates: `--lr auto` (the default) takes, per task and side, the rate of the tries in `<task>/lr_tries/`
with the highest mean training reward (final turn) over the last quarter of the try's generated tokens. A try is one
training run at one of the `--lr_tries` rates (default 1e-4, 3e-4, 1e-3) on seed `--try_seed`, at `--try_budget`
tokens (a third of a part's), without held-out evaluation, so the rule never sees the held-out rows; the command runs
the tries a part needs that the folder lacks before the part, and `--tries_only` stops after them. `--lr RATE` sets
one rate for every side instead (the report says so).

The tasks and sides: `tasks.py` and `sides.py`; the statistics: `report.py`; the benchmark's page: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time


HERE = os.path.dirname(os.path.abspath(__file__))
# The arithmetic kind the screen chose (results/screen.md): the untrained model is right 10-50% of the time.
ARITHMETIC_KIND = "add_1digit"
ARITHMETIC_TEMPERATURE = 1.0
# The learning rates --lr auto tries, per task and side: around PEFT's usual LoRA rates. At 3e-3 every arithmetic side
# ended with a held-out score of 0 (seed 0, results_small/).
LR_TRIES = (1e-4, 3e-4, 1e-3)
SIZES = {
    # tokens per part (writing: per agent; the single agent writes twice that) and per turn (arithmetic); generated
    # tokens per run, per task (a learning-rate try: a third); sampled answers per held-out row in evaluation
    "default": {"writing_tokens": 24, "arithmetic_tokens": 12, "eval_samples": 4,
                "token_budget": {"writing": 12288, "arithmetic": 6144}},
    "smoke": {"writing_tokens": 4, "arithmetic_tokens": 3, "eval_samples": 1,
              "token_budget": {"writing": 48, "arithmetic": 48}},
}  # fmt: skip


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.machine()


def build_tiny_chat_model(folder: str) -> str:
    """A random hidden-32 Llama with a chat template (`trl_multiagent.demo.testing`), for the smoke run."""
    from trl_multiagent.demo.testing import make_model, make_tool_tokenizer

    tokenizer = make_tool_tokenizer()
    make_model(tokenizer, seed=0).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def make_task(name: str, cli):
    from .tasks import arithmetic_task, writing_task

    if name == "writing":
        return writing_task(cli.writing_tokens)
    return arithmetic_task(cli.arithmetic_kind, cli.arithmetic_tokens, cli.arithmetic_temperature)


def task_settings(name: str, cli, model_desc: str) -> dict:
    from .sides import LORA, NUM_GENERATIONS, PROMPTS_PER_STEP

    settings = {"model": model_desc, "token_budget": cli.token_budget[name], "eval_samples": cli.eval_samples,
                "num_generations": NUM_GENERATIONS, "prompts_per_step": PROMPTS_PER_STEP, "temperature": make_task(name, cli).temperature,
                "lora": f"r={LORA['r']} alpha={LORA['lora_alpha']} {LORA['target_modules']}",
                "try_budget": cli.try_budget[name], "try_seed": cli.try_seed,
                "learning_rate": f"{cli.lr:g} (--lr)" if cli.lr != "auto" else
                                 "auto, tries " + ", ".join(f"{lr:g}" for lr in sorted(cli.lr_tries))}  # fmt: skip
    if name == "writing":
        settings["tokens_per_part"] = cli.writing_tokens
    else:
        settings.update(tokens_per_turn=cli.arithmetic_tokens, arithmetic_kind=cli.arithmetic_kind)
    return settings


def check_settings(results: str, task: str, settings: dict, *, tries_only: bool = False) -> None:
    """Write `<task>/settings.json` on the first run; refuse a run whose settings differ from it. A tries-only run
    neither checks nor records how parts pick their rate (`learning_rate`): tries at more rates may join the folder;
    the first parts record it."""
    path = os.path.join(results, task, "settings.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if tries_only:
        settings = {k: v for k, v in settings.items() if k != "learning_rate"}
    recorded = {}
    if os.path.exists(path):
        with open(path) as f:
            recorded = json.load(f)
    differ = {k: (recorded[k], v) for k, v in settings.items() if k in recorded and recorded[k] != v}
    if differ:
        raise SystemExit(
            f"team_vs_single: {path} records other settings for task {task!r} than this run's "
            f"({', '.join(f'{k}: recorded {a!r}, now {b!r}' for k, (a, b) in differ.items())}): parts with other "
            "settings do not merge. Use another --results folder, or the recorded settings."
        )
    missing = {k: v for k, v in settings.items() if k not in recorded}
    if missing and recorded and set(missing) != {"learning_rate"}:
        raise SystemExit(
            f"team_vs_single: {path} does not record {sorted(missing)} for task {task!r}: it was written by another "
            "version of this benchmark, and its parts may not merge with this run's. Use another --results folder."
        )
    if missing:
        write_json(path, {**recorded, **missing})


def lr_try_path(results: str, task: str, side: str, lr: float, seed: int) -> str:
    return os.path.join(results, task, "lr_tries", side, f"lr{lr:g}_seed{seed}.json")


def chosen_learning_rate(results: str, task: str, side: str, rates: list[float], seed: int) -> tuple[float, list]:
    """The rule: of the tries at `rates` on `seed`, the one with the highest last-quarter training reward; also every
    try's (rate, reward)."""
    from .report import last_quarter_reward

    tries = []
    for lr in sorted(rates):
        with open(lr_try_path(results, task, side, lr, seed)) as f:
            tries.append((lr, last_quarter_reward(json.load(f)["curve"])))
    return max(tries, key=lambda t: t[1])[0], tries


def write_json(path: str, data: dict) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    partial = f"{path}.{os.getpid()}.tmp"  # one per process: parts run side by side may write the same file
    with open(partial, "w") as f:
        json.dump(data, f, indent=1)
    os.replace(partial, path)  # a part killed mid-write leaves no file, and is run again


def run_screen(cli, model_path: str) -> None:
    from transformers import AutoTokenizer

    from .generation import load_agent
    from .screen import screen, screen_markdown, screen_table
    from .tasks import ARITHMETIC_KINDS

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    load = os.getloadavg()
    start = time.perf_counter()
    rows = screen(load_agent(model_path), tokenizer, max_new_tokens=cli.arithmetic_tokens,
                  temperatures=cli.screen_temperatures, samples=4, seed=0, questions=cli.screen_questions,
                  kinds=cli.screen_kinds)  # fmt: skip
    this_pass = {"kinds": cli.screen_kinds or list(ARITHMETIC_KINDS), "temperatures": cli.screen_temperatures, "seconds": time.perf_counter() - start,
                 "load_average_before": load, "load_average_after": os.getloadavg()}  # fmt: skip
    # Passes at other temperatures add to the screen; a (kind, temperature) screened again replaces its row.
    path = os.path.join(cli.results, "screen.json")
    screened = {"rows": [], "passes": []}
    if os.path.exists(path):
        with open(path) as f:
            screened = json.load(f)
    new = {(r["kind"], r["temperature"]) for r in rows}
    rows = [r for r in screened["rows"] if (r["kind"], r["temperature"]) not in new] + rows
    rows.sort(key=lambda r: (list(ARITHMETIC_KINDS).index(r["kind"]), r["temperature"]))
    passes = screened.get("passes", []) + [this_pass]
    write_json(path, {"rows": rows, "passes": passes})
    with open(os.path.join(cli.results, "screen.md"), "w") as f:
        f.write(screen_markdown(rows, passes, cli.arithmetic_tokens, cli.screen_questions))
    print(screen_table(rows))


def main(argv=None) -> None:
    from .sides import SIDES
    from .tasks import ARITHMETIC_KINDS

    parser = argparse.ArgumentParser(prog="python -m benchmarks.team_vs_single", description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", nargs="+", default=list(SIDES), choices=list(SIDES))
    parser.add_argument("--sides", nargs="+", default=None, help="subset of each task's sides (default: all)")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--results", default=os.path.join(HERE, "results"), help="the results folder")
    parser.add_argument("--model", default="smollm2", help="smollm2 (the embedded model), or a local folder")
    parser.add_argument("--smoke", action="store_true", help="a tiny random model at a tiny budget (the test)")
    parser.add_argument(
        "--token_budget",
        type=int,
        default=None,
        help="generated tokens per run (default: per task, 12288 writing, 6144 arithmetic)",
    )
    parser.add_argument("--writing_tokens", type=int, default=None, help="tokens per part (writing)")
    parser.add_argument("--arithmetic_tokens", type=int, default=None, help="tokens per turn (arithmetic)")
    parser.add_argument("--eval_samples", type=int, default=None, help="sampled answers per held-out row")
    parser.add_argument("--arithmetic_kind", default=ARITHMETIC_KIND, choices=list(ARITHMETIC_KINDS))
    parser.add_argument("--arithmetic_temperature", type=float, default=ARITHMETIC_TEMPERATURE,
                        help="sampling temperature of the arithmetic task (training and evaluation)")  # fmt: skip
    parser.add_argument("--lr", default="auto", help="'auto' (the tries' rule) or one rate for every side")
    parser.add_argument("--lr_tries", nargs="+", type=float, default=list(LR_TRIES),
                        help="the learning rates tried for --lr auto (default: %(default)s)")  # fmt: skip
    parser.add_argument("--tries_only", action="store_true", help="run the learning-rate tries, and no part")
    parser.add_argument(
        "--try_budget",
        type=int,
        default=None,
        help="generated tokens per learning-rate try (default: a third of the task's --token_budget)",
    )
    parser.add_argument("--try_seed", type=int, default=100)
    parser.add_argument("--screen", action="store_true", help="run the arithmetic screen (and no part)")
    parser.add_argument("--screen_questions", type=int, default=24, help="held-out questions per kind in the screen")
    parser.add_argument("--screen_temperatures", nargs="+", type=float, default=[0.0, 1.0], help="0: greedy")
    parser.add_argument("--screen_kinds", nargs="+", default=None, choices=list(ARITHMETIC_KINDS),
                        help="the kinds to screen (default: all)")  # fmt: skip
    parser.add_argument("--report_only", action="store_true", help="only merge the results folder's parts")
    parser.add_argument("--overwrite", action="store_true",
                        help="rerun parts whose result files exist (not the learning-rate tries: delete a try's file "
                             "to rerun it, since the rate it chose may already have trained other seeds)")  # fmt: skip
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    cli = parser.parse_args(argv)

    size = SIZES["smoke" if cli.smoke else "default"]
    for key, value in size.items():
        if getattr(cli, key) is None:
            setattr(cli, key, value)
        elif key == "token_budget":  # one budget given: every selected task's
            cli.token_budget = dict.fromkeys(SIDES, cli.token_budget)
    if cli.try_budget is None:
        cli.try_budget = {task: budget // 3 for task, budget in cli.token_budget.items()}
    else:
        cli.try_budget = dict.fromkeys(SIDES, cli.try_budget)
    known = {side for task in cli.tasks for side in SIDES[task]}
    unknown = sorted(set(cli.sides or []) - known)
    if unknown:
        raise SystemExit(f"team_vs_single: --sides {unknown} are not sides of the tasks selected "
                         f"({', '.join(f'{t}: {list(SIDES[t])}' for t in cli.tasks)}).")  # fmt: skip
    if cli.lr != "auto":
        try:
            cli.lr = float(cli.lr)
        except ValueError:
            raise SystemExit(f"team_vs_single: --lr takes 'auto' or a number, got {cli.lr!r}.") from None
    os.makedirs(cli.results, exist_ok=True)

    from .report import write_report

    if not cli.report_only:
        import torch

        torch.set_num_threads(cli.threads)
        with tempfile.TemporaryDirectory(prefix="team_vs_single_") as workdir:
            if cli.smoke:
                model_path = build_tiny_chat_model(workdir)
                model_desc = "random hidden-32 Llama with a chat template (smoke)"
            elif cli.model == "smollm2":
                from trl_multiagent.demo.models import prepare_default_model

                model_path, model_desc = prepare_default_model(), "SmolLM2-135M-Instruct (embedded)"
            else:
                model_path = model_desc = cli.model
            if cli.screen:
                run_screen(cli, model_path)
            else:
                for task_name in cli.tasks:
                    run_task(cli, task_name, model_path, model_desc)
    path, _ = write_report(cli.results)
    print(f"Report: {path}")


def run_task(cli, task_name: str, model_path: str, model_desc: str) -> None:
    from .report import last_quarter_reward
    from .sides import SIDES, run_part

    check_settings(cli.results, task_name, task_settings(task_name, cli, model_desc), tries_only=cli.tries_only)
    task = make_task(task_name, cli)
    sides = [s for s in SIDES[task_name] if cli.sides is None or s in cli.sides]
    if cli.lr == "auto" or cli.tries_only:
        budget = cli.try_budget[task_name]
        for side in sides:
            for lr in cli.lr_tries:
                path = lr_try_path(cli.results, task_name, side, lr, cli.try_seed)
                if os.path.exists(path):
                    continue
                print(f"team_vs_single: try {task_name}/{side} lr {lr:g} ({budget} tokens) ...", flush=True)
                result = run_part(task, side, model_path=model_path, seed=cli.try_seed, learning_rate=lr,
                                  token_budget=budget, eval_samples=0, evaluate_held_out=False)  # fmt: skip
                write_json(path, {**result, **provenance(), "command": command_line()})
                print(f"  {result['steps']} steps, {result['train_s']:.0f} s; last-quarter training reward "
                      f"{last_quarter_reward(result['curve']):.3f}", flush=True)  # fmt: skip
    if cli.tries_only:
        return
    for seed in cli.seeds:
        for side in sides:  # interleaved by seed, so that load from elsewhere hits the sides alike
            path = os.path.join(cli.results, task_name, side, f"seed{seed}.json")
            if os.path.exists(path) and not cli.overwrite:
                print(f"team_vs_single: {path} exists, skipped", flush=True)
                continue
            lr, rule = (cli.lr, "set with --lr") if cli.lr != "auto" else (None, None)
            if lr is None:
                lr, tries = chosen_learning_rate(cli.results, task_name, side, cli.lr_tries, cli.try_seed)
                rule = "highest last-quarter training reward of the tries " + ", ".join(
                    f"{rate:g}: {reward:.3f}" for rate, reward in tries
                )
            budget = cli.token_budget[task_name]
            print(f"team_vs_single: {task_name}/{side} seed {seed}, lr {lr:g}, {budget} tokens ...", flush=True)
            result = run_part(task, side, model_path=model_path, seed=seed, learning_rate=lr, token_budget=budget,
                              eval_samples=cli.eval_samples)  # fmt: skip
            write_json(path, {**result, **provenance(), "learning_rate_rule": rule, "command": command_line()})
            print(f"  {result['steps']} steps, {result['generated_tokens']} tokens, {result['train_s']:.0f} s; "
                  f"held-out {sum(result['before']['final']) / len(result['before']['final']):.3f} -> "
                  f"{sum(result['after']['final']) / len(result['after']['final']):.3f}", flush=True)  # fmt: skip


def provenance() -> dict:
    """Where a part or try ran: the machine, the libraries and the source revision (parts merge across machines)."""
    from benchmarks.bench_vs_comlrl import library_versions, source_revision

    return {"machine": machine(), "versions": library_versions(), "revision": source_revision()}


def machine() -> str:
    return f"{os.cpu_count()} CPUs ({cpu_name()}), no GPU used"


def command_line() -> str:
    return "python -m benchmarks.team_vs_single " + " ".join(sys.argv[1:])


if __name__ == "__main__":
    main()
