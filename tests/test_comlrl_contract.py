"""CoMLRL 1.4.3's own public-behaviour tests pass with `trl_multiagent.comlrl`'s classes swapped in (MAGRPO's, the
REINFORCE family's, IAC's and MAAC's): the CI subset of `tests/comlrl_contract/run_comlrl_tests.py` (tests that pass
on CoMLRL), run offline through the harness, each test's outcome asserted.

It needs CoMLRL's sdist and a Python with CoMLRL 1.4.3 (the harness makes both once, with the network, in
`~/.cache/trl_multiagent/comlrl_contract`); without them it is skipped, saying how to make them. The whole selection,
stock and swapped, is a longer run: tests/comlrl_contract/README.md says how."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


HARNESS_DIR = Path(__file__).parent / "comlrl_contract"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "trl_multiagent" / "comlrl_contract"
SDIST = Path(os.environ.get("COMLRL_CONTRACT_SDIST", CACHE / "sdist" / "comlrl-1.4.3.tar.gz"))
PYTHON = Path(os.environ.get("COMLRL_CONTRACT_PYTHON", CACHE / "venv" / "bin" / "python"))


def ci_subset() -> list[str]:
    lines = (line.strip() for line in (HARNESS_DIR / "ci_subset.txt").read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


@pytest.mark.slow  # about a minute on 2 cores (two interpreters import torch, transformers and the package)
def test_comlrl_public_behaviour_tests_pass_swapped(tmp_path):
    if not SDIST.exists() or not PYTHON.exists():
        pytest.skip(
            f"CoMLRL's sdist ({SDIST}) or a Python with CoMLRL 1.4.3 ({PYTHON}) is missing: run "
            "`python tests/comlrl_contract/run_comlrl_tests.py --mode stock` once (it makes both), or set "
            "COMLRL_CONTRACT_SDIST / COMLRL_CONTRACT_PYTHON"
        )
    summary = tmp_path / "summary.json"
    command = [sys.executable, str(HARNESS_DIR / "run_comlrl_tests.py"), str(SDIST), "--mode", "swapped"]
    command += ["--subset", "ci", "--python", str(PYTHON), "--workdir", str(tmp_path / "work"), "--json", str(summary)]
    repo = str(Path(__file__).resolve().parents[1])  # this checkout's package, for the harness as for the tests
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")])),
    }
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, env=env)
    output = done.stdout[-6000:] + done.stderr[-3000:]
    assert done.returncode == 0, output
    outcomes = json.loads(summary.read_text())["outcomes"]["swapped"]
    assert outcomes == dict.fromkeys(ci_subset(), "passed"), output
