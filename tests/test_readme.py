"""What the README claims, checked against what the code does."""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SANDBOX_INSTALL


ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def main_job_launch_options() -> list[str]:
    """The options the README's main-job command gives `accelerate launch`, before the recipe."""
    line = next(line for line in README.splitlines() if "accelerate launch" in line and "length_ratio.py" in line)
    words = shlex.split(line.split("&& accelerate launch", 1)[1])
    return words[: words.index("recipes/length_ratio.py")]


@pytest.mark.slow  # a run of its own, kept out of the default suite for time (docs/tests.md, "The default suite")
def test_under_the_readmes_accelerate_launch_a_flag_error_is_the_last_line(tmp_path):
    """accelerate raises CalledProcessError (a traceback of about 25 lines) after any child that exits non-zero,
    unless launched with -q: the README's command has it, so the recipe's one line stays the last one."""
    options = main_job_launch_options()
    assert options == ["-q"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HOME": str(tmp_path)}  # this checkout; no accelerate config
    done = subprocess.run(
        [sys.executable, "-m", "accelerate.commands.accelerate_cli", "launch", *options, "recipes/length_ratio.py",
         "--output_dir", str(tmp_path / "out"), "--num_turn", "2"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert lines[-1] == "length_ratio.py: unknown flag --num_turn (did you mean --num_turns or --num_iterations?)"
    assert done.returncode == 1 and "Traceback" not in done.stderr


def test_the_install_line_for_the_sandbox_is_the_one_the_skip_line_prints():
    command = re.search(r"`(apt-get install[^`]*)`", SANDBOX_INSTALL).group(1)
    assert f"bubblewrap (`{command}`, which pip cannot install)" in README
