"""The README's quickstart runs as printed, on the embedded model, trimmed to 2 steps; its team folder says what it is."""

import json
import os
import re
import subprocess
import sys

import pytest

from trl_multiagent.prepared_models import PREPARED_MODEL_MARKER as MARKER
from trl_multiagent.prepared_models import prepared_description


README = os.path.join(os.path.dirname(__file__), os.pardir, "README.md")


def quickstart_code() -> str:
    """The python blocks of the README's `## Quickstart` section, in order, as one script."""
    text = open(README, encoding="utf-8").read()
    section = re.search(r"^## Quickstart\n(.*?)(?=^## )", text, re.S | re.M)
    assert section, "README.md has no '## Quickstart' section"
    blocks = re.findall(r"^```python\n(.*?)^```", section.group(1), re.S | re.M)
    assert len(blocks) >= 2, f"the quickstart has {len(blocks)} python block(s)"
    return "\n".join(blocks)


def test_quickstart_names_the_embedded_model_and_the_hub_id():
    code = quickstart_code()
    assert "model_name = prepare_default_model()" in code
    assert '# model_name = "HuggingFaceTB/SmolLM2-135M-Instruct"' in code


@pytest.mark.slow
def test_quickstart_runs_as_printed(tmp_path):
    code = quickstart_code()
    assert code.count("max_steps=16") == 1
    trimmed = code.replace("max_steps=16", "max_steps=2")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(
        [sys.executable, "-c", trimmed], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1200
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    output = tmp_path / "outputs" / "quickstart"
    assert "Summary over 2 logged steps" in done.stdout and "turn 1 reward" in done.stdout  # the main job's summary
    state = json.loads((output / "trainer_state.json").read_text())  # what `python -m trl_multiagent.plot` reads
    assert [entry["step"] for entry in state["log_history"] if "turn_1/reward_mean" in entry] == [1, 2]
    assert sorted(p.name for p in output.iterdir() if p.name.startswith("checkpoint")) == []  # save_strategy="no"
    for agent in ("agent_0", "agent_1"):
        adapter = json.loads((output / agent / "adapter_config.json").read_text())
        # PEFT's record, as it wrote it: the prepared folder (the team card says what it is; `load_team` prepares it
        # again where it is missing)
        assert adapter["base_model_name_or_path"].endswith("SmolLM2-135M-Instruct")
        assert os.path.isfile(os.path.join(adapter["base_model_name_or_path"], MARKER))
        assert adapter["r"] == 16
    card = (output / "README.md").read_text()
    # the base as its prepared folder's marker describes it (a folder prepared by an earlier release names no
    # quantisation; tests/test_saved_team_files.py checks a fresh marker's words)
    base = prepared_description(adapter["base_model_name_or_path"])
    assert "# quickstart: a 2-agent team trained with MAGRPO" in card, card
    assert f"About the base: {base}." in card and "`SmolLM2-135M-Instruct.Q4_1.gguf`" in card, card
