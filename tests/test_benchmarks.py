"""The benchmark scripts run end to end in smoke mode (tiny model, one step). Not timed: timing is theirs."""

import os
import re
import subprocess
import sys

import pytest


BENCH = os.path.join(os.path.dirname(__file__), "..", "benchmarks")


def smoke(script: str, *args: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, os.path.join(BENCH, script), "--smoke", *args], capture_output=True, text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.splitlines()


@pytest.mark.slow  # about 40 s on 2 cores: two teams, each in a fresh process
def test_bench_memory_smoke():
    lines = smoke("bench_memory.py")
    assert any("shared base + LoRA" in line for line in lines)
    assert any("separate full models" in line for line in lines)


@pytest.mark.slow  # over a minute on 2 cores: each tree shape, chunked and not, in a fresh process
def test_bench_memory_tree_smoke():
    lines = smoke("bench_memory.py", "--tree")
    # K=2 at per_device_train_batch_size=8: 8 rows per agent with one turn, 8 * (1 + 2) with two
    assert [line.split()[:3] for line in lines[1:]] == [["2", "1", "8"], ["2", "2", "24"]]


@pytest.mark.slow  # about 40 s on 2 cores: four trainers, each in a fresh process
def test_bench_critics_smoke():
    """Each side trains at the same rows per agent; the critics' parameters are counted: IAC's two critic models, then
    MAAC's one, then IAC's heads on the actors add parameters to MAGRPO's team, in that order."""
    import json

    sides = {r["side"]: r for r in json.loads(smoke("bench_critics.py")[-1])}
    assert list(sides) == ["magrpo", "iac", "iac_heads", "maac"]
    assert {r["rows_per_agent"] for r in sides.values()} == {8} and all(r["step_s"] > 0 for r in sides.values())
    params = {side: r["params"] for side, r in sides.items()}
    assert params["iac"] > params["maac"] > params["iac_heads"] > params["magrpo"], params


def test_bench_limit_smoke():
    lines = smoke("bench_limit.py")
    assert "rows per step: 40" in lines  # 1 prompt, K=4: (4 + 16) joint answers x 2 agents
    assert any(line.startswith("naive batched compute") for line in lines)
    assert any(line.startswith("ours (transformers) / naive step time:") for line in lines)


def test_bench_limit_reports_every_phase_of_every_step():
    """Wall-clock, this process's CPU and the other processes' CPU seconds of each phase, for each step of each run."""
    lines = smoke("bench_limit.py", "--skip_naive", "--repeats", "2", "--fixed_length")
    assert any(line.endswith("every completion exactly that long") for line in lines)
    rows = [line.split() for line in lines if line.startswith("transformers #")]
    assert [row[:3] for row in rows] == [["transformers", "#1", "1"], ["transformers", "#2", "1"]]
    for row in rows:
        phases = [cell.split("/") for cell in row[3:9]]  # sync, generate, reward, transition, logps, update
        assert all(len(cell) == 3 for cell in phases)
        wall, cpu, _ = (float(x) for x in phases[5])
        assert wall > 0 and cpu > 0  # the update computed, on this process's CPU
    # the noise floor: the same backend's update, repeat 2 / repeat 1 at the same step (one ratio: no interval)
    floor = re.fullmatch(r"  transformers: (\d+\.\d{3}) \((\d) of 1 within 5%; mean (\S+) ± nan\)", lines[-1])
    assert floor, lines[-3:]
    ratio = float(floor[1])
    # the ratio is the one the step rows show: repeat 2's update wall / repeat 1's, each printed to 0.005 s
    first, second = (float(row[3:9][5].split("/")[0]) for row in rows)
    assert (second - 0.005) / (first + 0.005) <= ratio <= (second + 0.005) / max(first - 0.005, 1e-9)
    assert int(floor[2]) == (abs(ratio - 1.0) <= 0.05) and float(floor[3]) == ratio  # one ratio: the mean is it


def test_bench_branching_smoke():
    """K=4, T=3: full expansion grows 1 + 4 + 16 nodes per prompt (84 rows per agent), best-only 3 (12 rows)."""
    lines = smoke("bench_branching.py")
    rows = {line.split()[0]: line.split() for line in lines if line.startswith(("all ", "best "))}
    assert rows["all"][2] == "84" and rows["best"][2] == "12"
    assert int(rows["all"][3]) > int(rows["best"][3]) > 0  # generated tokens
    assert any(line.startswith("step 1: best-only generates") for line in lines)


@pytest.mark.slow  # about 40 s on 2 cores
def test_gpu_check_dry_run_writes_its_table(tmp_path):
    """The GPU check's code path on a CPU (`gpu_check.sh --dry`): tiny Qwen2, CoMLRL where installed, the LoRA team
    of 4; its table holds a row per run, with the numbers the runs measured."""
    table = tmp_path / "table.md"
    out = subprocess.run(
        ["bash", os.path.join(BENCH, "gpu_check.sh"), "--dry", "--out", str(table)], capture_output=True, text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=900,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = table.read_text().splitlines()
    assert "tiny Qwen2 (dry run)" in lines[0] and "peak RSS MB" in lines[2]
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ")[1:6] for line in lines if line.startswith("| ours")}
    assert set(rows) >= {"ours, 2 agents", "ours, shared-base LoRA team of 4 (r=16)"}
    for name, cells in rows.items():
        if name != "ours / CoMLRL":
            assert all(float(cell) > 0 for cell in cells), (name, cells)
    assert any(line.startswith("| CoMLRL 1.4.3, 2 agents |") for line in lines)
