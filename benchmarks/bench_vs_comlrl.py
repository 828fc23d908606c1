"""The seed task (length-ratio example) trained by CoMLRL's `MAGRPOTrainer` and by ours, side by side.

Each trainer runs in a fresh subprocess of its own (`comlrl_worker.py`, `ours_worker.py`), one after the other, on
the same model folder with the same settings. Reported per trainer: the wall time of `train()`, joint answers/s,
generated tokens/s, peak memory, the tree each built (counted during training), and where the time goes.

    python benchmarks/bench_vs_comlrl.py --model tiny --repeats 3 --comlrl_python ~/.venvs/comlrl/bin/python

What is measured and how, how to install CoMLRL, the commands behind the published figures and how the two trainers'
settings map: docs/benchmark_vs_comlrl.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile


HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
# Each trainer's worker script, launched as `python <script> --worker <trainer> --spec <json>` in a fresh process.
WORKER_SCRIPTS = {"comlrl": "comlrl_worker.py", "ours": "ours_worker.py", "ours_vllm": "ours_worker.py"}
TRAINERS = tuple(WORKER_SCRIPTS)
COMLRL_VERSION = "1.4.3"
INSTALL_HINT = (
    "python -m venv --system-site-packages ~/.venvs/comlrl && "
    f"~/.venvs/comlrl/bin/python -m pip install --no-deps comlrl=={COMLRL_VERSION} && "
    "~/.venvs/comlrl/bin/python -m pip install wandb; then pass --comlrl_python ~/.venvs/comlrl/bin/python"
)

# Model presets: (hidden, layers) for the random tiny Llama; None for a folder.
PRESETS = {
    "smoke": {"hidden": 32, "layers": 2, "prompts": 1, "max_new_tokens": 4, "threads": 1},
    "tiny": {"hidden": 256, "layers": 4, "prompts": 6, "max_new_tokens": 48, "threads": 1},
    "smollm2": {"prompts": 2, "max_new_tokens": 32, "threads": None},
    "path": {"prompts": 2, "max_new_tokens": 32, "threads": None},
}


def checkout_first(env: dict, repo: str = REPO) -> dict:
    """`env` with `repo` (this checkout) first on PYTHONPATH, so that a subprocess imports its trl_multiagent."""
    return {**env, "PYTHONPATH": os.pathsep.join([repo, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)}


def export_revision(revision: str, folder: str) -> str:
    """The files of this repository at `revision` (`git archive`), in `folder`: a baseline's source, for `--baseline`."""
    os.makedirs(folder)
    archive = subprocess.run(["git", "-C", REPO, "archive", revision], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", folder], input=archive, check=True)
    return folder


def build_tiny_model(folder: str, hidden: int, layers: int) -> str:
    """Write the random tiny Llama of `trl_multiagent.demo.testing` to `folder`, from a subprocess.

    This process stays small: a worker started from it inherits its peak resident memory (`ru_maxrss` survives
    `exec`), so a driver that had imported torch and trl_multiagent would raise the workers' memory baseline and hide
    part of their peak.
    """
    code = (
        "import sys\n"
        "from trl_multiagent.demo.testing import make_model, make_tokenizer\n"
        "folder, hidden, layers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])\n"
        "tokenizer = make_tokenizer()\n"
        "make_model(tokenizer, seed=0, hidden=hidden, layers=layers).save_pretrained(folder)\n"
        "tokenizer.save_pretrained(folder)\n"
    )
    command = [sys.executable, "-c", code, folder, str(hidden), str(layers)]
    subprocess.run(command, check=True, env=checkout_first(dict(os.environ)))
    return folder


def resolve_model(cli, workdir: str) -> tuple[str, str]:
    """(model folder, description)."""
    if cli.smoke or cli.model == "tiny":
        preset = PRESETS["smoke" if cli.smoke else "tiny"]
        folder = build_tiny_model(os.path.join(workdir, "model"), preset["hidden"], preset["layers"])
        return (
            folder,
            f"random Llama, hidden {preset['hidden']}, {preset['layers']} layers, 400-token vocab "
            "(trl_multiagent.demo.testing)",
        )
    if cli.model == "smollm2":
        from trl_multiagent.demo.models import prepare_default_model

        return prepare_default_model(), "SmolLM2-135M-Instruct (trl_multiagent.demo.models)"
    if not os.path.isdir(cli.model):
        raise SystemExit(f"bench_vs_comlrl: --model must be tiny, smollm2 or a local folder; {cli.model!r} is none.")
    return cli.model, cli.model


def comlrl_available(python: str) -> tuple[bool, str]:
    out = subprocess.run(
        [python, "-c", "import comlrl, comlrl.trainers.reinforce as r; r.MAGRPOTrainer; print(comlrl.__version__)"],
        check=False, capture_output=True, text=True, env={**os.environ, "WANDB_MODE": "disabled"},
    )  # fmt: skip
    if out.returncode != 0:
        lines = (out.stderr or out.stdout).strip().splitlines()
        return False, lines[-1] if lines else f"exit status {out.returncode}"
    return True, out.stdout.strip()


def run_in_subprocess(trainer: str, spec: dict, python: str, script: str, repo: str = REPO) -> dict:
    """Run `script --worker trainer --spec ...` with `python`, importing `repo`'s trl_multiagent, and return the dict
    its last `RESULT ` line holds."""
    env = {**os.environ, "OMP_NUM_THREADS": str(spec["threads"]), "TOKENIZERS_PARALLELISM": "false"}
    env = checkout_first({**env, "WANDB_MODE": "disabled"}, repo)
    command = [python, os.path.abspath(script), "--worker", trainer, "--spec", json.dumps(spec)]
    out = subprocess.run(command, check=False, capture_output=True, text=True, env=env)
    results = [line[len("RESULT ") :] for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    if out.returncode != 0 or not results:
        raise SystemExit(
            f"{os.path.basename(script)}: the {trainer} run (seed {spec.get('seed')}) failed (exit status "
            f"{out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-6000:]}"
        )
    return json.loads(results[-1])


def source_revision() -> str:
    """The commit of this checkout, with '+dirty' when trl_multiagent/ has uncommitted changes (or 'unknown')."""
    try:
        commit = subprocess.run(
            ["git", "-C", REPO, "rev-parse", "--short", "HEAD"], check=True, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", REPO, "status", "--porcelain", "--", "trl_multiagent"], check=True, capture_output=True,
            text=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit + ("+dirty" if dirty else "")


def library_versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    out = [f"python {sys.version.split()[0]}"]
    for name in ("torch", "transformers", "trl", "accelerate"):
        try:
            out.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            pass
    return ", ".join(out)


def load_average() -> str:
    try:
        return ", ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def fmt(value, digits=2):
    if value is None:
        return "-"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:,.{digits}f}"


def print_report(spec: dict, results: dict, model_desc: str, skipped_note: str | None) -> None:
    print()
    print("Settings (equal on both sides):")
    print(f"  model: {model_desc} [{spec['model_path']}], dtype {spec['dtype']}, device {spec['device']}, "
          f"torch threads {spec['threads']}")  # fmt: skip
    print(f"  agents {spec['num_agents']}, K (num_generations) {spec['num_generations']}, turns {spec['num_turns']}, "
          f"joint_mode aligned, early termination off, prompts {spec['prompts']}, epochs {spec['epochs']}, "
          f"max_new_tokens {spec['max_new_tokens']}, learning rate {spec['learning_rate']}, "
          f"temperature {spec['temperature']}, top_p {spec['top_p']}, top_k off, seed {spec['seed']}")  # fmt: skip
    for name, r in results.items():
        print(f"  {name} {r['version']}: " + ", ".join(f"{k}={v}" for k, v in r["settings"].items()))
    print(f"  trl_multiagent source: {spec.get('revision', 'unknown')}; {spec.get('versions', '')}")
    print(
        f"  expected joint answers per prompt per epoch: K + K*K = {spec['num_generations'] + spec['num_generations'] ** 2}"
    )
    if spec.get("defaults"):
        print("  ours runs with MAGRPOConfig's defaults, except the fields that define the task (--defaults)")
    if spec.get("ours_micro_batches", 1) != 1:
        print(f"  DIAGNOSTIC: ours runs its update in {spec['ours_micro_batches']} micro-batches (gradient "
              "accumulation), not the comparison's single batch")  # fmt: skip
    if skipped_note:
        print(f"NOTE: {skipped_note}")

    gpu = any("peak_gpu_mb" in r for r in results.values())
    columns = ["trainer", "wall s", "joint answers", "joint answers/s", "gen tokens", "gen tokens/s", "peak RSS MB"]
    columns += ["peak GPU MB"] if gpu else []
    print()
    print("| " + " | ".join(columns) + " |")
    print("|" + "|".join("---" for _ in columns) + "|")
    for name, r in results.items():
        row = [name, fmt(r["wall_s"]), fmt(r["joint_answers"]), fmt(r["joint_answers"] / r["wall_s"]),
               fmt(r["generated_tokens"]), fmt(r["generated_tokens"] / r["wall_s"], 1), fmt(r["peak_rss_mb"], 0)]  # fmt: skip
        row += [fmt(r.get("peak_gpu_mb"), 0)] if gpu else []
        print("| " + " | ".join(row) + " |")
    baselines = [name for name in results if name.startswith("ours@")]
    for num, den in (
        ("ours", "comlrl"),
        ("ours_vllm", "comlrl"),
        ("ours_vllm", "ours"),
        ("ours+reuse", "ours"),
        *(("ours", b) for b in baselines),
        *(("ours+reuse", b) for b in baselines),
    ):
        if num not in results or den not in results:
            continue
        o, c = results[num], results[den]
        ratio = [f"{num}/{den}", fmt(o["wall_s"] / c["wall_s"]) + "x", "",
                 fmt((o["joint_answers"] / o["wall_s"]) / (c["joint_answers"] / c["wall_s"])) + "x", "",
                 fmt((o["generated_tokens"] / o["wall_s"]) / (c["generated_tokens"] / c["wall_s"])) + "x",
                 fmt(o["peak_rss_mb"] / max(c["peak_rss_mb"], 1e-9)) + "x"]  # fmt: skip
        if gpu:
            ratio += [fmt(o.get("peak_gpu_mb", 0) / max(c.get("peak_gpu_mb", 0), 1e-9)) + "x"]
        print("| " + " | ".join(ratio) + " |")

    print()
    print("Tree check (counted during training):")
    print("| trainer | turn-1 joint answers | turn-2 joint answers | reward calls | transitions | generate calls "
          "| sequences generated | optimizer steps |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for name, r in results.items():
        turns = r["joint_answers_turn"]
        print(f"| {name} | {turns.get('1', turns.get(1, 0))} | {turns.get('2', turns.get(2, 0))} | {r['reward_calls']} "
              f"| {r['transitions']} | {r['generate_calls']} | {r['generated_sequences']} | {r['optimizer_steps']} |")  # fmt: skip

    print()
    print("Where the time goes (seconds; generate = inside the agents' generate calls, and ours' prompt prefill just "
          "before them, update = forward + backward + optimizer step, other = the rest of train()):")  # fmt: skip
    print("| trainer | generate | reward + transition | update | other | setup (load + build, not in wall) "
          "| RSS after build MB |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for name, r in results.items():
        other = r["wall_s"] - r["generate_s"] - r["reward_s"] - r["transition_s"] - r["update_s"]
        print(f"| {name} | {fmt(r['generate_s'])} | {fmt(r['reward_s'] + r['transition_s'], 3)} | {fmt(r['update_s'])} "
              f"| {fmt(other)} | {fmt(r['setup_s'])} | {fmt(r.get('built_rss_mb'), 0)} |")  # fmt: skip
    if "ours" in results and "ours_vllm" in results:
        o, v = results["ours"], results["ours_vllm"]
        print()
        print(f"Generate phase, weight syncs included: ours {o['generate_s']:.2f} s, ours_vllm {v['generate_s']:.2f} s "
              f"(of which syncs {v['sync_s']:.2f} s): vLLM is {o['generate_s'] / v['generate_s']:.2f}x faster; "
              f"whole train(): {o['wall_s'] / v['wall_s']:.2f}x.")  # fmt: skip
    for name in ("ours", "ours_vllm"):
        if name not in results:
            continue
        o = results[name]
        logged = o["logged"]
        print()
        print(f"{name}, from trainer.state.log_history (summed over the logged steps): "
              + ", ".join(f"{k} {v:.3f}" for k, v in logged.items())
              + f"; timed around every step: loss fwd+bwd = training_step - rollout = {o['loss_fwd_bwd_s']:.3f}, "
              + f"optimizer step {o['optimizer_s']:.3f}, outside the steps {o['wall_s'] - o['step_s'] - o['optimizer_s']:.3f}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", help="tiny, smollm2, or a local save_pretrained folder")
    parser.add_argument("--smoke", action="store_true", help="hidden-32 model, 1 prompt, 4 new tokens (for tests)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (cuda:N)")
    parser.add_argument("--prompts", type=int, default=None, help="number of prompts (default: per model)")
    parser.add_argument("--max_new_tokens", type=int, default=None, help="default: per model")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--learning_rate", type=float, default=1e-5)
    parser.add_argument("--num_generations", type=int, default=4)
    parser.add_argument("--num_turns", type=int, default=2)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--threads", type=int, default=None, help="torch threads per run (default 1 for tiny models)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--repeats", type=int, default=1, help="runs per trainer (interleaved); the fastest is reported"
    )
    parser.add_argument("--trainers", default="comlrl,ours", help="comma-separated subset of comlrl,ours")
    parser.add_argument("--comlrl_python", default=os.environ.get("COMLRL_PYTHON", sys.executable),
                        help="interpreter that has comlrl installed (default: $COMLRL_PYTHON, else this one)")  # fmt: skip
    parser.add_argument("--ours_micro_batches", type=int, default=1,
                        help="diagnostic: split our update into this many micro-batches (gradient accumulation; the "
                        "rollout and the single optimizer step are unchanged). The comparison's setting is 1.")  # fmt: skip
    parser.add_argument("--defaults", action="store_true",
                        help="ours with MAGRPOConfig's defaults, except the fields that define the task")  # fmt: skip
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--reuse_freed_memory", action="store_true",
                        help="also run ours with the opt-in allocator setting, trl_multiagent.devices."
                        "reuse_freed_memory(), called first in its process (ours+reuse)")  # fmt: skip
    parser.add_argument("--baseline", default=None,
                        help="a git revision: also run ours from that revision's source, interleaved (ours@REV)")  # fmt: skip
    cli = parser.parse_args()

    preset = PRESETS["smoke" if cli.smoke else cli.model if cli.model in PRESETS else "path"]
    trainers = [t.strip() for t in cli.trainers.split(",") if t.strip()]
    if any(t not in TRAINERS for t in trainers):
        raise SystemExit(f"bench_vs_comlrl: --trainers takes a subset of {TRAINERS}, got {cli.trainers!r}.")
    skipped_note = None
    if "comlrl" in trainers:
        ok, detail = comlrl_available(cli.comlrl_python)
        if not ok:
            trainers.remove("comlrl")
            skipped_note = (
                f"CoMLRL skipped: it is not importable with {cli.comlrl_python} ({detail}). Install it with: "
                f"{INSTALL_HINT}"
            )
            print(f"NOTE: {skipped_note}", flush=True)

    workdir = tempfile.mkdtemp(prefix="bench_vs_comlrl_")
    try:
        model_path, model_desc = resolve_model(cli, workdir)
        threads = cli.threads or preset["threads"] or os.cpu_count() or 1
        rows = (cli.prompts or preset["prompts"]) * cli.num_generations
        if rows % cli.ours_micro_batches:
            raise SystemExit(f"bench_vs_comlrl: prompts * K ({rows}) must be a multiple of --ours_micro_batches.")
        spec = {
            "model_path": model_path,
            "device": cli.device,
            "dtype": cli.dtype,
            "threads": threads,
            "seed": cli.seed,
            "num_agents": 2,
            "num_generations": cli.num_generations,
            "num_turns": cli.num_turns,
            "prompts": cli.prompts or preset["prompts"],
            "max_new_tokens": cli.max_new_tokens or preset["max_new_tokens"],
            "epochs": cli.epochs,
            "learning_rate": cli.learning_rate,
            "ours_micro_batches": cli.ours_micro_batches,
            "defaults": cli.defaults,
            "revision": source_revision(),
            "versions": library_versions(),
            "temperature": 1.0,
            "top_p": 1.0,
        }
        # each side: (worker, python, script, the source its trl_multiagent is imported from, its spec)
        sides = {
            t: (t, cli.comlrl_python if t == "comlrl" else sys.executable, os.path.join(HERE, WORKER_SCRIPTS[t]), REPO,
                spec)
            for t in trainers
        }  # fmt: skip
        if cli.reuse_freed_memory:
            sides["ours+reuse"] = ("ours", sys.executable, os.path.join(HERE, WORKER_SCRIPTS["ours"]), REPO,
                                   {**spec, "reuse_freed_memory": True})  # fmt: skip
        if cli.baseline:  # the same worker and task, on the baseline's package (and its worker script)
            source = export_revision(cli.baseline, os.path.join(workdir, "baseline"))
            script = os.path.join(source, "benchmarks", WORKER_SCRIPTS["ours"])
            sides[f"ours@{cli.baseline}"] = ("ours", sys.executable, script, source, spec)
        runs = {side: [] for side in sides}
        load_before = load_average()
        for repeat in range(cli.repeats):
            for side, (worker, python, script, source, side_spec) in sides.items():  # interleaved: load hits all
                print(f"running {side} ({python}), run {repeat + 1}/{cli.repeats} ...", flush=True)
                r = run_in_subprocess(worker, side_spec, python, script, source)
                runs[side].append(r)
                print(f"  {side}: {r['wall_s']:.2f} s, {r['joint_answers']} joint answers, "
                      f"{r['generated_tokens']} generated tokens", flush=True)  # fmt: skip
        # With repeats, each trainer's fastest run is reported (the one least disturbed by other load on the machine).
        results = {trainer: min(trainer_runs, key=lambda r: r["wall_s"]) for trainer, trainer_runs in runs.items()}
        print_report(spec, results, model_desc, skipped_note)
        load_after = load_average()
        print()
        print("Wall seconds of every run: " + "; ".join(
            f"{t} " + ", ".join(f"{r['wall_s']:.2f}" for r in rs) for t, rs in runs.items()
        ) + (" (fastest reported)" if cli.repeats > 1 else ""))  # fmt: skip
        print(f"Load average (1, 5, 15 min) before: {load_before}, after: {load_after}; CPUs: {os.cpu_count()}")
        if cli.json:
            with open(cli.json, "w") as f:
                json.dump({"spec": spec, "results": results, "runs": runs, "skipped": skipped_note,
                           "load_before": load_before, "load_after": load_after}, f, indent=2)  # fmt: skip
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
