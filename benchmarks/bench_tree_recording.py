"""What `log_rollout_trees` costs on the main job (recipes/length_ratio.py on the embedded SmolLM2-135M-Instruct):
the same short run with and without recording, side by side, in one process each.

    python benchmarks/bench_tree_recording.py --max_steps 4

Prints, for each run, the training time (`train_runtime`) and the mean step time, and for the recording run the time
spent in `TreeRecorder.record` per step (turning the trees into records, gathering, writing) and each step file's
size. Run it on a quiet machine, or read `uptime`'s load printed before and after each run.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from trl_multiagent.trees import store


ROOT = Path(__file__).resolve().parent.parent


def load_recipe():
    spec = importlib.util.spec_from_file_location("length_ratio", ROOT / "recipes" / "length_ratio.py")
    recipe = importlib.util.module_from_spec(spec)
    sys.modules["length_ratio"] = recipe  # its dataclasses look their module up there
    spec.loader.exec_module(recipe)
    return recipe


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def run(recipe, output_dir: str, max_steps: int, record: bool) -> dict:
    spent = []
    original = store.TreeRecorder.record

    def timed(self, *args, **kwargs):
        start = time.perf_counter()
        path = original(self, *args, **kwargs)
        if path is not None:
            spent.append(time.perf_counter() - start)
        return path

    store.TreeRecorder.record = timed
    try:
        flags = ["--output_dir", output_dir, "--max_steps", str(max_steps), "--report_to", "none",
                 "--log_rollout_trees", str(record).lower(), "--seed", "0"]  # fmt: skip
        print(f"[{'with' if record else 'without'} recording] load before: {uptime()}", flush=True)
        trainer = recipe.main(*recipe.make_parser().parse_args_and_config(args=flags))
        print(f"[{'with' if record else 'without'} recording] load after: {uptime()}", flush=True)
    finally:
        store.TreeRecorder.record = original
    runtime = trainer.state.log_history[-1]["train_runtime"]
    files = store.step_files(output_dir)
    return {
        "runtime": runtime,
        "record_s": spent,
        "sizes": [os.path.getsize(p) for p in files.values()],
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--max_steps", type=int, default=4)
    args = parser.parse_args()
    recipe = load_recipe()
    recipe.one_thread_unless_told()
    results = {}
    with tempfile.TemporaryDirectory() as folder:
        for record in (False, True):
            results[record] = run(recipe, os.path.join(folder, str(record)), args.max_steps, record)
    off, on = results[False], results[True]
    print(f"\n{args.max_steps} steps each")
    print("| run | train_runtime (s) | per step (s) | recording per step (s) | step file (KB) |")
    print("|---|---|---|---|---|")
    print(f"| without recording | {off['runtime']:.1f} | {off['runtime'] / args.max_steps:.2f} | – | – |")
    rec = statistics.mean(on["record_s"]) if on["record_s"] else float("nan")
    kb = [s / 1024 for s in on["sizes"]]
    print(
        f"| with recording | {on['runtime']:.1f} | {on['runtime'] / args.max_steps:.2f} | {rec:.4f} (max "
        f"{max(on['record_s']):.4f}) | {statistics.mean(kb):.1f} (max {max(kb):.1f}) |"
    )


if __name__ == "__main__":
    main()
