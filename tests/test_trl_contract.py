"""TRL's own GRPOTrainer tests with MAGRPOConfig/MAGRPOTrainer (one agent) swapped in: the CI subset of
`tests/trl_contract/run_trl_tests.py` (`ci_subset.txt`: tests that run our code, in the areas TRL users reach: PEFT,
`beta` and the reference, `sync_ref_model`, the entropy bonus, loss types, `trainer.model`, tools and environments),
run offline through the harness with MAGRPOConfig's defaults, and, with `TRL_CONTRACT_CHECKPOINTING=ours,trl`, at the
same time with GRPOConfig's own activation checkpointing (True, which MAGRPOConfig turns off on a CPU): CI runs the
first alone, since the two at once took 29 min beside CI's other slow run (2026-12-07) and would take the whole run
near its hard limit. Each test's outcome is asserted, and every difference
from the recorded stock run (`stock_outcomes.json`: outcome and place of failure) must be in the reviewed list.

The whole file, stock and swapped, is a long run: tests/trl_contract/README.md says how, and what it found."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import skipped_trl_contract_tests


HARNESS = Path(__file__).parent / "trl_contract" / "run_trl_tests.py"
CI_SUBSET = Path(__file__).parent / "trl_contract" / "ci_subset.txt"
# TRL's test files, unmodified: TRL_CONTRACT_TESTS_DIR (a TRL checkout's tests/), else the folder CI has beside the
# repo (shared/trl_tests/tests). TRL's PyPI sdist ships no tests, so a clone has neither: the slow run skips, named in
# the run's last lines (conftest.py).
TRL_TESTS = Path(
    os.environ.get("TRL_CONTRACT_TESTS_DIR", Path(__file__).resolve().parents[2] / "shared" / "trl_tests" / "tests")
)
# A stand-in for TRL's file and helpers, shipped here: the harness's own logic is tested on it on any clone.
SYNTHETIC_TRL_TESTS = Path(__file__).parent / "trl_contract" / "synthetic_trl_tests"


def stated_outcomes() -> dict[str, str]:
    """ci_subset.txt: `OUTCOME TEST_ID  # AREA` per line."""
    lines = [line.partition("#")[0].split() for line in CI_SUBSET.read_text().splitlines()]
    return {words[1]: words[0] for words in lines if words}


# Which activation checkpointing the harness runs with, each a run of its own at the same time: "ours" (MAGRPOConfig's
# default), "trl" (GRPOConfig's).
CHECKPOINTING = os.environ.get("TRL_CONTRACT_CHECKPOINTING", "ours").split(",")


@pytest.mark.slow  # the harness's runs (and the offline models' first build): CI's slow stage runs it
def test_trl_grpo_tests_swapped_ci_subset_each_with_its_outcome(tmp_path):
    if not (TRL_TESTS / "test_grpo_trainer.py").exists():
        reason = f"TRL's test files are not at {TRL_TESTS} (set TRL_CONTRACT_TESTS_DIR to a TRL checkout's tests/)"
        skipped_trl_contract_tests.append(reason)
        pytest.skip(reason)
    assets = tmp_path / "assets"  # built once, shared by both runs
    assets.mkdir()
    runs = {}
    for checkpointing in CHECKPOINTING:
        work = tmp_path / checkpointing
        work.mkdir()
        (work / "assets").symlink_to(assets, target_is_directory=True)
        command = [sys.executable, str(HARNESS), str(TRL_TESTS), "--mode", "swapped", "--subset", "ci",
                   "--activation-checkpointing", checkpointing, "--workdir", str(work),
                   "--json", str(work / "summary.json")]  # fmt: skip
        if runs:  # once the first run has built the assets (their stamp is written last)
            deadline = time.monotonic() + 900
            first = next(iter(runs.values()))[0]
            while not (assets / "assets.json").exists() and first.poll() is None:
                assert time.monotonic() < deadline, "the offline assets were not built in 15 minutes"
                time.sleep(2)
        process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
            start_new_session=True,  # the harness and its pytest, killed together if the test stops first
        )
        runs[checkpointing] = (process, work / "summary.json")
    stated = stated_outcomes()
    try:
        for checkpointing, (process, summary_file) in runs.items():
            output = process.communicate(timeout=1800)[0][-8000:]  # two at once, beside CI's other slow run
            assert process.returncode == 0, output
            summary = json.loads(summary_file.read_text())
            assert summary["activation_checkpointing"] == checkpointing
            assert summary["unlisted"] == [] and summary["ci_mismatches"] == [], output
            outcomes = summary["outcomes"]["swapped"]
            assert {test_id: outcomes.get(test_id) for test_id in stated} == stated, output
    finally:
        for process, _ in runs.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)


def test_the_harness_compares_where_each_test_fails_not_only_whether(tmp_path):
    """`--from-results` on a swapped run against a stock record: the same test failing at another line of TRL's file
    is another failure (`elsewhere`), which the list must name as such; failing at the same place is `stock`; passing
    here where stock fails is `stock-only`, also to be explained. Unexplained ones fail the run (exit 1). PATH is the
    shipped stand-in for TRL's test folder: `--from-results` runs no test, and needs no TRL checkout."""
    import trl

    def failed(line):
        return {"outcome": "failed", "failure": {"when": "call", "exception": "AssertionError", "test_line": line}}

    file = "test_grpo_trainer.py::TestGRPOTrainer::"
    stock = {f"{file}moved": failed(1880), f"{file}same": failed(1880), f"{file}fixed": failed(900)}
    record = tmp_path / "stock.json"
    record.write_text(json.dumps({"versions": {"trl": trl.__version__}, "tests": stock}))
    swapped = {f"{file}moved": failed(1867), f"{file}same": failed(1880), f"{file}fixed": {"outcome": "passed"}}
    counts = dict(total=3, ran=3, passed=1, failed=2, error=0, skipped=0, xfailed=0, xpassed=0)
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "swapped.json").write_text(
        json.dumps({"mode": "swapped", "command": None, "wall_seconds": 1, "counts": counts, "tests": swapped})
    )

    def compare(listed: str) -> tuple[int, dict, str]:
        expected = tmp_path / "expected.txt"
        expected.write_text(listed)
        command = [sys.executable, str(HARNESS), str(SYNTHETIC_TRL_TESTS), "--mode", "swapped", "--from-results",
                   "--workdir", str(tmp_path), "--stock-record", str(record), "--expected", str(expected)]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
        assert done.returncode in (0, 1), done.stderr[-3000:]
        return done.returncode, json.loads((tmp_path / "results" / "summary.json").read_text()), done.stdout

    code, summary, output = compare("[stock: same]\n" + f"{file}moved -- r\n{file}same -- r\n")
    assert code == 1 and summary["elsewhere"] == [f"{file}moved"] and summary["stock"] == [f"{file}same"]
    assert summary["stock-only"] == [f"{file}fixed"]
    assert sorted(summary["unlisted"]) == [f"{file}fixed", f"{file}moved"] and summary["drift"] == [f"{file}moved"]
    assert "stock: AssertionError at line 1880; swapped: AssertionError at line 1867" in output
    code, summary, _ = compare(
        f"[stock: same]\n{file}same -- r\n[elsewhere: moved]\n{file}moved -- r\n[stock-only: fixed]\n{file}fixed -- r\n"
    )
    assert code == 0 and summary["unlisted"] == [] and summary["drift"] == []


def test_the_harness_refuses_a_folder_without_trls_helpers(tmp_path):
    """PATH must hold TRL's test file and the helpers it imports: a folder with the test file alone is a set-up
    error (exit 2) naming each missing file, before any model is built or test run."""
    (tmp_path / "test_grpo_trainer.py").write_text((SYNTHETIC_TRL_TESTS / "test_grpo_trainer.py").read_text())
    command = [sys.executable, str(HARNESS), str(tmp_path), "--mode", "swapped", "--workdir", str(tmp_path / "work")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-3000:]
    assert f"PATH {tmp_path} lacks testing_utils.py, conftest.py, __init__.py" in done.stderr
    assert not (tmp_path / "work").exists()
