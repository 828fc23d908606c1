"""Credit-assignment options of MAGRPO, measured on the seed task: one command reruns all the evidence.

    python benchmarks/credit/run.py --out benchmarks/credit/results               # the suite, SmolLM2, 3 seeds
    python benchmarks/credit/run.py --out DIR --seeds 0 1 2 --steps 10            # the same, explicitly
    python benchmarks/credit/run.py --out DIR --estimate_only                     # print the time estimate, exit
    python benchmarks/credit/run.py --out DIR --resume                            # continue an interrupted run
    python benchmarks/credit/run.py --out DIR --smoke                             # tiny random model, ~30 s (tests)
    python benchmarks/credit/run.py --out DIR --mechanisms_only --seeds 0 1 2 3 4 # the mechanism checks, ~1 min

**What is trained.** The embedded model (SmolLM2-135M-Instruct, `trl_multiagent.demo.models`) as a 2-agent team on
the suite's task (`credit_task.py`: the seed's length-ratio reward and feedback, weight 0.75, plus a per-agent "on topic"
reward, weight 0.25; the seed's 4 training prompts, chat template), 2 turns, K=4, 24 new tokens, temperature 1,
early termination 0.9, one prompt per step, shared-base LoRA r=16 on all linear layers, learning rate 3e-3 (the main
job's setting, `recipes/length_ratio.py`). Every trained method gets the same optimizer steps (`--steps`) and seeds;
only one option differs from today's defaults in each:

| method | what differs |
|---|---|
| `untrained` | no training: the base model in both seats (LoRA adapters at initialisation, which PEFT starts at zero) |
| `single_policy` | single-agent GRPO on the same team reward: ONE LoRA adapter whose weights serve both seats (`model=[policy, policy]`, the same module: the two seats' losses add into one set of gradients, one optimizer state). It acts in seat 0 and seat 1 with the same prompts, so it cannot condition on its seat |
| `defaults` | today's defaults: `branching="all"`, `scale_rewards="group"`, `team_reward_weight=1.0` |
| `branching_best` | `branching="best"` (AT-GRPO, PettingLLMs): only a node's best joint answer goes on to turn 2 |
| `scale_agent` | `scale_rewards="agent"` (Dr. MAS): each agent's advantages divided by the std of its own returns |
| `alpha_0.7` | `team_reward_weight=0.7` (PettingLLMs): agent i learns from 0.7 * team + 0.3 * own_i (`credit_task.py`) |
| `agent_lr` | `agent_learning_rates=[lr, lr / 2]` (Dr. MAS), one untuned setting; run only when the trainer honours it (the worker checks the optimizer's parameter groups, and reports the method as skipped otherwise) |

**Evaluation** (after training, on the saved team): `trl_multiagent.evaluation.evaluate_team` on the 8 held-out
prompts of `trl_multiagent.demo.examples.HELD_OUT_PROMPTS` (disjoint from the training prompts, listed in results.md):
sampled rollouts, K = `--eval_generations` answers per agent and node, every joint answer continued, early
termination off; per prompt and turn the mean team reward, then the mean over the 8 prompts: one number per seed and
turn. The table gives the mean over seeds ± the 95% confidence half-width over seeds (Student t, n - 1 degrees of
freedom, `evaluation.mean_ci`). Comparison lines against `defaults` are written from the intervals alone: "higher
than defaults (intervals do not overlap)", "lower than defaults (intervals do not overlap)" or "not distinguishable
from defaults (intervals overlap)".

**Controls** (`evaluate_team`'s): role swap (the trained defaults team with its agents exchanging seats) and best-of-N
at equal inference budget (one agent, agent 0 of the trained defaults team, and the base model for `untrained`, in
every seat; N rollouts per prompt so that its sampled tokens match the team's evaluation; the best by final-turn
reward, an oracle selection).

**Matched budgets.** Every trained method runs `--steps` optimizer steps; its sampled tokens (every agent's completion
tokens over training, read from each step's rollout tree) are reported beside. Branching best samples fewer tokens
per step, so the report also gives each method's training turn-1 reward against sampled tokens (a plot, and a line
comparing `branching_best` with `defaults` at the same sampled tokens). Turn 1 is not selected by branching; the
training turn-2 reward of `branching_best` is that of the best joint answer's continuation, so it is not comparable.

**Mechanism checks** (`credit_mechanisms.py`, tiny random models, every seed): per-agent gradient norms with rewards 100x
apart under `scale_rewards="batch"` and `"agent"`; tokens and reward with best-only branching against full expansion
at T = 3.

**Runs.** Each (method, seed) trains and evaluates in its own subprocess, one after the other; the mechanism checks
run in one more. With `--smoke` (a random hidden-32 model, 4 tokens, 1 seed, 2 steps) every spec runs in ONE
subprocess, to stay within the test's time. After each subprocess the results so far go to `DIR/partial_results.json`
with the settings; `--resume` keeps those of the same settings and runs only the rest (an interrupted suite loses at
most one run), and refuses a file written with other settings.

**Budget.** Before starting, the script prints an estimate: it times the suite's specs on the tiny model at the
suite's settings (a calibration subprocess, about 30 s: 3 steps each, the median step), and scales by the cost ratio
of the embedded model to the tiny one: `SMOLLM2_DEFAULTS_STEP_S` (30 s, the measured train() time per step of this
setting on this 2-core machine: the main job's 16 steps in 479 s, benchmarks/learning.md section 3) over the tiny
model's measured defaults step. Evaluation time is scaled by the same ratio, plus 15 s of loading per subprocess. It
also prints the estimate at 40 s per step (the slowest steps measured in learning.md's screens). Measured here
(2026-12-04, load average 2.5-3.5 from other jobs, which makes the tiny timings noisy): 1.6 to 2.1 hours for the
defaults (`--steps 10`, 3 seeds), 2.1 to 2.8 hours at 40 s per step: under the suite's budget of 3 hours.

Writes `DIR/results.json` (every number, per seed), `DIR/results.md` (tables, comparison lines, controls, mechanism
checks, the machine, the date, the command) and `DIR/reward_vs_steps.png`, `DIR/reward_vs_tokens.png`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time


HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

TRAINED = ["single_policy", "defaults", "branching_best", "scale_agent", "alpha_0.7", "agent_lr"]
ALL_METHODS = ["untrained", *TRAINED]
SMOLLM2_DEFAULTS_STEP_S = 479.0 / 16  # benchmarks/learning.md section 3: the main job, 16 steps of this setting
BUDGET_S = 3 * 3600  # the whole suite's budget on the 2-core machine
MODEL_LOAD_S = 15.0  # per subprocess on the embedded model: imports and loading (the tiny model's is measured)


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def clean(value):
    """JSON without NaN/inf: they become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    return value


def run_subprocess(specs: list[dict], threads: int) -> list[dict]:
    """`run.py --worker --spec <json list>` in a fresh interpreter; the results of its `RESULT ` lines."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false", "WANDB_MODE": "disabled"}
    env["PYTHONPATH"] = os.pathsep.join([REPO, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    command = [sys.executable, os.path.abspath(__file__), "--worker", "--spec", json.dumps(specs)]
    out = subprocess.run(command, check=False, capture_output=True, text=True, env=env)
    results = [json.loads(line[len("RESULT ") :]) for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    if out.returncode != 0 or len(results) != len(specs):
        names = ", ".join(f"{s['kind']}:{s.get('method', '')}:{s.get('seed', '')}" for s in specs)
        raise SystemExit(
            f"credit/run.py: the worker for [{names}] failed (exit status {out.returncode}):\n"
            f"{out.stdout[-3000:]}\n{out.stderr[-6000:]}"
        )
    return results


def worker_main(specs: list[dict]) -> None:
    import credit_worker as worker

    for spec in specs:
        if spec.get("model_path") is None:  # --smoke: the tiny model, built here to save a subprocess
            from trl_multiagent.demo.testing import make_model, make_tokenizer

            folder = tempfile.mkdtemp(prefix="credit_tiny_")
            tokenizer = make_tokenizer()
            make_model(tokenizer, seed=0, hidden=32, layers=2).save_pretrained(folder)
            tokenizer.save_pretrained(folder)
            for other in specs:
                other["model_path"] = other.get("model_path") or folder
        start = time.perf_counter()
        result = worker.run_spec(spec)
        result["wall_s"] = time.perf_counter() - start
        print("RESULT " + json.dumps(clean(result)), flush=True)


def make_specs(cli, model_path, chat: bool, methods: list[str], seeds: list[int], steps: int) -> list[dict]:
    common = dict(
        model_path=model_path, chat=chat, lora_r=cli.lora_r, learning_rate=cli.lr, steps=steps, num_turns=2,
        num_generations=4, max_new_tokens=cli.max_new_tokens, early_termination=0.9,
        eval_generations=cli.eval_generations, eval_batch=8, threads=cli.threads,
    )  # fmt: skip
    specs = []
    for seed in seeds:
        for method in methods:
            kind = "untrained" if method == "untrained" else "train"
            specs.append({**common, "kind": kind, "method": method, "seed": seed, "controls": method == "defaults"})
    mech = {**common, "kind": "mechanisms", "seeds": seeds, "mech_steps": cli.mech_steps,
            "mech_max_new_tokens": cli.mech_max_new_tokens}  # fmt: skip
    return specs + [mech]


def spec_key(entry: dict) -> tuple:
    """What one subprocess ran: a spec and its result share it (the mechanism checks: one for all seeds)."""
    return entry["kind"], entry.get("method"), entry.get("seed")


def settings_of(specs: list[dict]) -> dict:
    """The settings every spec shares (the first spec's, less what differs between specs)."""
    return {k: v for k, v in specs[0].items() if k not in ("kind", "method", "seed", "controls")}


def resumed_results(path: str, specs: list[dict]) -> list[dict]:
    """The results of an interrupted run (`--resume`): those of `path` whose spec is still asked for.

    Refused when the interrupted run had other settings (steps, model, tokens, ...): mixing them would break the
    matched budgets."""
    if not os.path.exists(path):
        print(f"--resume: no {path} yet; starting from the first run.", flush=True)
        return []
    with open(path) as f:
        saved = json.load(f)
    if saved.get("settings") != clean(settings_of(specs)):
        raise SystemExit(
            f"credit/run.py --resume: {path} was written with other settings: {saved.get('settings')}, this run has "
            f"{clean(settings_of(specs))}. Rerun with that run's options, or give another --out."
        )
    wanted = {spec_key(spec) for spec in specs}
    kept = [r for r in saved["results"] if spec_key(r) in wanted]
    print(f"--resume: {len(kept)} of {len(specs)} runs already done in {path}; running the rest.", flush=True)
    return kept


def estimate(cli, specs: list[dict]) -> dict:
    """Time the specs on the tiny model at the suite's settings (3 steps, one seed), scale to the embedded model."""
    calibration = []
    for spec in specs:
        if spec["kind"] == "mechanisms" or spec["seed"] != specs[0]["seed"]:
            continue
        calibration.append({**spec, "model_path": None, "chat": False, "steps": 3, "lora_r": 4, "threads": 1})
    start = time.perf_counter()
    timed = run_subprocess(calibration, threads=1)
    calibration_s = time.perf_counter() - start
    by_method = {r["method"]: r for r in timed}

    def step_s(r: dict) -> float:  # the median step: the first one also warms up
        seconds = sorted(s["seconds"] for s in r.get("steps", []))
        return seconds[len(seconds) // 2] if seconds else 0.0

    tiny_step = step_s(by_method["defaults"])
    ratio = SMOLLM2_DEFAULTS_STEP_S / tiny_step
    per_seed = {}
    for method, r in by_method.items():
        train = step_s(r) * cli.steps * ratio
        per_seed[method] = train + r.get("eval_s", 0.0) * ratio + MODEL_LOAD_S
    seeds = len({s["seed"] for s in specs if s["kind"] != "mechanisms"})
    mechanisms = 10.0 + 2.0 * seeds * cli.mech_steps  # tiny models: a few seconds per run
    total = seeds * sum(per_seed.values())
    return {
        "total_s": total + mechanisms,
        "total_s_at_40s_per_step": (total + mechanisms) * 40.0 / SMOLLM2_DEFAULTS_STEP_S,
        "per_seed_s": per_seed,
        "cost_ratio": ratio,
        "tiny_defaults_step_s": tiny_step,
        "smollm2_defaults_step_s": SMOLLM2_DEFAULTS_STEP_S,
        "calibration_s": calibration_s,
        "how": (
            "each spec timed on the random hidden-32 model at the suite's settings (3 steps, the median step), train "
            f"and evaluation times scaled by {ratio:.0f} = {SMOLLM2_DEFAULTS_STEP_S:.1f} s (SmolLM2 defaults step, benchmarks/"
            f"learning.md section 3) / {tiny_step:.3f} s (tiny defaults step), plus {MODEL_LOAD_S:.0f} s loading per "
            "subprocess"
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required="--worker" not in sys.argv, help="output folder")
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="default 0 1 2 (smoke: 0)")
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps per trained method (default 10)")
    parser.add_argument("--smoke", action="store_true", help="random hidden-32 model, 4 tokens, 2 steps, 1 seed")
    parser.add_argument("--model", default="smollm2", help="smollm2 (the embedded model) or a local folder")
    parser.add_argument("--methods", nargs="+", default=ALL_METHODS, choices=ALL_METHODS)
    parser.add_argument("--lora_r", type=int, default=16)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--max_new_tokens", type=int, default=24)
    parser.add_argument("--eval_generations", type=int, default=2, help="K of the held-out evaluation")
    parser.add_argument("--mech_steps", type=int, default=None, help="steps of each mechanism run (default 8)")
    parser.add_argument("--mech_max_new_tokens", type=int, default=8)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: one per CPU)")
    parser.add_argument("--estimate_only", action="store_true", help="print the time estimate and exit")
    parser.add_argument(
        "--mechanisms_only", action="store_true", help="only the mechanism checks (tiny models, about a minute)"
    )
    parser.add_argument("--resume", action="store_true",
                        help="keep the runs already done in OUT/partial_results.json (same settings) and run the rest")  # fmt: skip
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    cli = parser.parse_args()
    if cli.worker:
        worker_main(json.loads(cli.spec))
        return

    import credit_report as report

    command = "python benchmarks/credit/run.py " + " ".join(sys.argv[1:])
    seeds = cli.seeds or ([0] if cli.smoke else [0, 1, 2])
    steps = cli.steps or (2 if cli.smoke else 10)
    cli.steps = steps
    cli.mech_steps = cli.mech_steps or (2 if cli.smoke else 8)
    if cli.mechanisms_only:  # tiny random models, built by the checks themselves
        model_path, model_desc, chat = None, "none (mechanism checks only: tiny random models)", False
    elif cli.smoke:
        model_path, model_desc, chat = None, "random hidden-32 Llama (smoke)", False
        cli.max_new_tokens, cli.mech_max_new_tokens, cli.lora_r, cli.lr = 4, 4, 4, 1e-3
        cli.threads = cli.threads or 1
    elif cli.model == "smollm2":
        from trl_multiagent.demo.models import prepare_default_model

        model_path, model_desc, chat = (
            prepare_default_model(),
            "SmolLM2-135M-Instruct (trl_multiagent.demo.models)",
            True,
        )
    else:
        model_path, model_desc, chat = cli.model, cli.model, True
    cli.threads = cli.threads or os.cpu_count() or 1
    specs = make_specs(cli, model_path, chat, [] if cli.mechanisms_only else cli.methods, seeds, steps)
    os.makedirs(cli.out, exist_ok=True)
    partial_path = os.path.join(cli.out, "partial_results.json")
    results = resumed_results(partial_path, specs) if cli.resume else []

    budget = None
    if not (cli.smoke or cli.mechanisms_only):
        print("Estimating the suite's time (tiny-model calibration, about 30 s) ...", flush=True)
        budget = estimate(cli, specs)
        print(f"Estimated time of the suite: {budget['total_s'] / 3600:.2f} h ({budget['how']}).", flush=True)
        print(
            f"At 40 s per step (learning.md's slowest): {budget['total_s_at_40s_per_step'] / 3600:.2f} h.", flush=True
        )
        if budget["total_s"] > BUDGET_S:
            print(
                f"WARNING: over the suite's budget of {BUDGET_S / 3600:.0f} h: lower --steps or --seeds.", flush=True
            )
        if cli.estimate_only:
            print(json.dumps(clean(budget), indent=1))
            return

    machine = {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
               "cpus": os.cpu_count(), "torch_threads": cli.threads, "load_before": load_average(),
               "python": sys.version.split()[0]}  # fmt: skip
    started = datetime.datetime.now(datetime.timezone.utc)
    start = time.perf_counter()
    done = {spec_key(r) for r in results}
    todo = [spec for spec in specs if spec_key(spec) not in done]
    # --smoke runs every spec in one subprocess, the suite one subprocess per spec
    for batch in [todo] if cli.smoke and todo else [[spec] for spec in todo]:
        if not cli.smoke:
            label, seed = batch[0].get("method", batch[0]["kind"]), batch[0].get("seed", seeds)
            print(f"[{time.perf_counter() - start:7.0f} s] {label}, seed(s) {seed} ...", flush=True)
        results += run_subprocess(batch, cli.threads)
        with open(partial_path, "w") as f:  # what --resume continues from
            json.dump(clean({"settings": settings_of(specs), "results": results}), f)
    order = {spec_key(spec): i for i, spec in enumerate(specs)}
    results.sort(key=lambda r: order[spec_key(r)])
    machine["load_after"] = load_average()
    meta = {
        "command": command, "date_utc": started.isoformat(timespec="seconds"), "wall_s": time.perf_counter() - start,
        "model": model_desc, "chat_prompts": chat, "seeds": seeds, "steps": steps, "machine": machine,
        "settings": settings_of(specs), "resumed": len(done),
        "estimate": budget, "smoke": cli.smoke,
    }  # fmt: skip
    summary = report.summarize(results, meta)
    with open(os.path.join(cli.out, "results.json"), "w") as f:
        json.dump(clean(summary), f, indent=1)
    text = report.markdown(summary)
    with open(os.path.join(cli.out, "results.md"), "w") as f:
        f.write(text)
    pngs = report.plots(summary, cli.out) if summary["methods"] else []  # no training curve to draw
    print(text)
    print(f"Wrote {cli.out}/results.json, results.md, {', '.join(os.path.basename(p) for p in pngs)} in "
          f"{meta['wall_s']:.0f} s.")  # fmt: skip


if __name__ == "__main__":
    main()
