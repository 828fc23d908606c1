"""benchmarks/bench_vs_comlrl.py runs end to end in smoke mode and prints its tables. Not timed: timing is its own.

Without CoMLRL installed (the usual test environment) the benchmark runs ours only and says that CoMLRL was skipped;
with CoMLRL importable (by this interpreter, or the one in $COMLRL_PYTHON) it runs both and prints the ratio row.
"""

import json
import os
import subprocess
import sys


HERE = os.path.dirname(__file__)
BENCH = os.path.join(HERE, "..", "benchmarks", "bench_vs_comlrl.py")
COLUMNS = ["trainer", "wall s", "joint answers", "joint answers/s", "gen tokens", "gen tokens/s", "peak RSS MB"]


def _cells(line):
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def test_bench_vs_comlrl_smoke(tmp_path):
    out_json = tmp_path / "bench.json"
    out = subprocess.run(
        [sys.executable, BENCH, "--smoke", "--json", str(out_json)],
        check=False, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=900,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = out.stdout.splitlines()

    header = next(line for line in lines if line.startswith("| trainer | wall s"))
    assert _cells(header)[: len(COLUMNS)] == COLUMNS
    rows = {_cells(line)[0]: _cells(line) for line in lines[lines.index(header) + 2 :] if line.startswith("| ")}
    assert "ours" in rows
    assert len(rows["ours"]) == len(_cells(header))

    skipped = any(line.startswith("NOTE: CoMLRL skipped") for line in lines)
    if skipped:
        assert "comlrl" not in rows and "ours/comlrl" not in rows
        assert "pip install --no-deps comlrl==1.4.3" in out.stdout  # says how to get the comparison
    else:
        assert "comlrl" in rows and "ours/comlrl" in rows

    # Both trainers build the full tree: 4 joint answers in turn 1 and 4 * 4 in turn 2 for the one prompt.
    result = json.loads(out_json.read_text())
    for name, r in result["results"].items():
        assert r["joint_answers_turn"] == {"1": 4, "2": 16}, name
        assert r["transitions"] == 4, name
        assert r["generated_sequences"] == 40, name  # 2 agents x (4 + 4 * 4) completions
        assert r["generated_tokens"] > 0 and r["peak_rss_mb"] > 0, name
    tree_rows = [line for line in lines if line.startswith("| ours | 4 | 16 |")]
    assert tree_rows, "tree check row missing"
