"""docs/agents.md's examples run as written on the embedded model, trimmed to one step each, and their agents call
tools in that step (a page whose examples train nothing would teach the silent failure the page warns about)."""

import json
import os
import re
import subprocess
import sys

import pytest


PAGE = os.path.join(os.path.dirname(__file__), os.pardir, "docs", "agents.md")


def training_examples() -> list[str]:
    """The page's python blocks that build a trainer, each a whole script."""
    text = open(PAGE, encoding="utf-8").read()
    return [block for block in re.findall(r"^```python\n(.*?)^```", text, re.S | re.M) if "MAGRPOTrainer(" in block]


def test_the_page_has_its_two_examples():
    examples = training_examples()
    assert len(examples) == 2
    for code in examples:
        assert "model_name = prepare_default_model()" in code and "processing_class=tokenizer" in code
        assert len(re.findall(r"max_steps=\d+", code)) == 1


@pytest.mark.slow
@pytest.mark.parametrize("index", [0, 1], ids=["notebook", "calculators"])
def test_each_example_runs_one_step_and_calls_tools(index, tmp_path):
    code = re.sub(r"max_steps=\d+", "max_steps=1", training_examples()[index])
    code += "\nimport json\nprint('LOG', json.dumps(trainer.state.log_history[0]))\n"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1200
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    logged = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("LOG "))[4:])
    assert logged["tools/call_frequency"] > 0, logged  # the agents called their tools
    assert logged["tools/failure_frequency"] < 1, logged  # and some calls ran
    assert "cannot learn" not in done.stderr
