"""CoMLRL 1.4.3's tutorial "Resuming Training" (docs `examples/advanced/resume-training.md`, from its sdist) runs
through the face as written: its Python blocks in order, as one script in a new Python process, with only these edits, each checked to
apply once:

- `comlrl` -> `trl_multiagent.comlrl` in the imports;
- the model id -> a tiny local model (`conftest.tiny_model_dir`);
- W&B offline, in the test's folder (environment variables of the process that runs the page).

Then what the page says holds: `checkpoint-1` and `checkpoint-2` after the first part, the newest checkpoint's W&B
run identity read back by `read_checkpoint_metadata`, the second part logging to that run, resuming at epoch 2 and
adding `checkpoint-3` and `checkpoint-4` of the same run.

The sdist: `$COMLRL_SDIST` (its `.tar.gz` or unpacked folder), else the contract harness's download
(`~/.cache/trl_multiagent/comlrl_contract/sdist/comlrl-1.4.3.tar.gz`, tests/comlrl_contract/README.md); skipped
without one.
"""

import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from trl_multiagent.comlrl.utils.checkpoint import read_checkpoint_metadata


PAGE = "docs/content/docs/examples/advanced/resume-training.md"
CACHED_SDIST = Path.home() / ".cache" / "trl_multiagent" / "comlrl_contract" / "sdist" / "comlrl-1.4.3.tar.gz"
IMPORTS = ("from comlrl.", "from trl_multiagent.comlrl.")
MODEL_ID = 'model_name = "Qwen/Qwen2.5-0.5B"'


def tutorial_page() -> str:
    source = Path(os.environ.get("COMLRL_SDIST") or CACHED_SDIST).expanduser()
    if source.is_dir():
        return (source / PAGE).read_text(encoding="utf-8")
    if source.is_file():
        with tarfile.open(source) as sdist:
            return sdist.extractfile(f"comlrl-1.4.3/{PAGE}").read().decode("utf-8")
    pytest.skip(f"CoMLRL 1.4.3's sdist not found ({source}): set COMLRL_SDIST, or run tests/comlrl_contract once.")


def edited_blocks(page: str, model_dir: str) -> list[str]:
    blocks = re.findall(r"^```python\n(.*?)^```", page, flags=re.S | re.M)
    assert len(blocks) == 4, "the tutorial's blocks changed: setup, build_trainer, first part, second part"
    assert sum(block.count(IMPORTS[0]) for block in blocks) == 2 and blocks[0].count(MODEL_ID) == 1
    blocks[0] = blocks[0].replace(*IMPORTS).replace(MODEL_ID, f"model_name = {model_dir!r}")
    assert "comlrl" not in blocks[0].replace("trl_multiagent.comlrl", "")
    return blocks


def run_script(tmp_path: Path, code: str, report: str) -> dict:
    """`code` in a new Python process in `tmp_path`, W&B offline there (apart from this process's wandb state, which
    reads its environment once), then `report`'s JSON of what it left."""
    script = tmp_path / "tutorial.py"
    script.write_text(f"{code}\nimport json, wandb\nprint('REPORT', json.dumps({report}))\n", encoding="utf-8")
    environment = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    environment.update(WANDB_MODE="offline", WANDB_DIR=str(tmp_path), WANDB_SILENT="true", OMP_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("REPORT "))
    return json.loads(line.removeprefix("REPORT "))


@pytest.mark.slow
def test_the_resume_training_tutorial_runs_as_written(tmp_path, tiny_model_dir):
    blocks = edited_blocks(tutorial_page(), tiny_model_dir)
    report = '{"run": wandb.run.id, "epoch": trainer.state.epoch, "identity": identity, "config": wandb_config}'
    after = run_script(tmp_path, "\n".join(blocks), report)
    folder = tmp_path / "checkpoints" / "resume-demo"
    names = sorted(p.name for p in folder.glob("checkpoint-*"))
    assert names == ["checkpoint-1", "checkpoint-2", "checkpoint-3", "checkpoint-4"]
    metadata = [read_checkpoint_metadata(folder / name) for name in names]
    assert [m["sequence"] for m in metadata] == [1, 2, 3, 4] and len({m["run_id"] for m in metadata}) == 1
    # the second part read checkpoint-2's W&B identity back, and its logs went to that run
    assert after["identity"] == {"id": after["run"], "project": "comlrl-examples"}
    assert after["config"] == {**after["identity"], "name": "resume-demo", "resume": "allow"}
    assert [m["wandb"] for m in metadata] == [after["identity"]] * 4
    assert after["epoch"] == 4  # resumed at epoch 2 (`num_train_epochs` counts the whole run), on to epoch 4
    first_part = json.loads((folder / "checkpoint-2" / "trainer_state.json").read_text())
    assert first_part["epoch"] == 2  # the page: after the first part, the directory holds checkpoint-1 and -2
