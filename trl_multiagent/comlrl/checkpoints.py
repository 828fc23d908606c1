"""CoMLRL 1.4.3's training checkpoints, in its face, on the Trainer's checkpoints.

As CoMLRL's (docs `user-guide/training-entities.md`, `examples/advanced/resume-training.md`):

- written only when asked: `train(checkpoint_dir=...)` after every `checkpoint_interval`-th epoch and after the last,
  and `save_checkpoint(output_dir)`; a plain `train()` writes none (the face's `save_strategy` is "no");
- one numbering rule: `checkpoint_dir/checkpoint-{n}`, n the epochs completed (CoMLRL's sequence, one per MAGRPO epoch;
  a last epoch cut short by `max_steps` counts as one); a resumed run counts on from its checkpoint's epochs, as the
  Trainer resumes at its step;
- a `checkpoint_dir` holding another run's `checkpoint-{n}` is refused, as are later checkpoints of another run when
  resuming; `checkpoint_total_limit` keeps the newest of this run's checkpoints;
- `read_checkpoint_metadata` reads `version`, `trainer_class`, `sequence`, `run_id` and `wandb` (the run's identity,
  to resume its W&B run) back before a trainer is built.

Each checkpoint is the Trainer's (each agent's `agent_{i}/`, optimizer, scheduler, RNG states, `trainer_state.json`,
the completion marker) with `comlrl_checkpoint.json`, which holds CoMLRL's metadata. CoMLRL's own `training_state.pt`
is neither written nor read here.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any


METADATA_NAME = "comlrl_checkpoint.json"
CHECKPOINT_VERSION = 1  # CoMLRL 1.4.3's CHECKPOINT_VERSION
COMLRL_STATE_NAME = "training_state.pt"  # CoMLRL's own checkpoint file, which the face does not read
NUMBERED = re.compile(r"checkpoint-(\d+)")
RUN_ID = re.compile(r"[0-9a-f]{32}")
WANDB_KEYS = ("id", "project", "entity")


def completed_epochs(state) -> int:
    """The checkpoint number at the Trainer's `state`: the epochs completed, a partial last one counted (its float
    `epoch` can be a hair off an integer after many steps)."""
    return 0 if state.epoch is None else max(math.ceil(state.epoch - 1e-6), 0)


def wandb_identity() -> dict[str, str] | None:
    """The W&B run this process logs to (`id`, and `project`/`entity` when known), as CoMLRL saves it; None without
    one. wandb is not imported for it: a run exists only once something imported wandb."""
    run = getattr(sys.modules.get("wandb"), "run", None)
    if run is None:
        return None
    identity = {key: value for key in WANDB_KEYS if isinstance(value := getattr(run, key, None), str) and value}
    return identity if "id" in identity else None


def write_metadata(folder: Path, metadata: dict[str, Any]) -> None:
    (folder / METADATA_NAME).write_text(json.dumps(metadata, indent=2) + "\n", encoding="utf-8")


def read_checkpoint_metadata(checkpoint) -> dict[str, Any]:
    """CoMLRL's `read_checkpoint_metadata`: a checkpoint's `version`, `trainer_class`, `sequence` (its number),
    `run_id` and `wandb` (None, or the run's `id` and `project`/`entity`), read before a trainer is built.

    `checkpoint`: a checkpoint folder of `train(checkpoint_dir=...)` or `save_checkpoint`, or its
    `comlrl_checkpoint.json`."""
    path = Path(checkpoint).expanduser()
    file = path / METADATA_NAME if path.is_dir() else path
    if not file.is_file():
        if path.is_dir() and (path / COMLRL_STATE_NAME).is_file():
            raise ValueError(
                f"read_checkpoint_metadata: {path} is a checkpoint of CoMLRL itself ({COMLRL_STATE_NAME}); "
                "trl_multiagent.comlrl reads and resumes its own checkpoints only (docs/from_comlrl.md, 'Checkpoints')."
            )
        raise FileNotFoundError(
            f"read_checkpoint_metadata: no {METADATA_NAME} in {path}: pass a checkpoint folder written by "
            "train(checkpoint_dir=...) or save_checkpoint of trl_multiagent.comlrl."
        )
    try:
        metadata = json.loads(file.read_text(encoding="utf-8"))
    except ValueError as error:
        raise ValueError(f"read_checkpoint_metadata: {file} is not valid JSON ({error}).") from None
    return checked_metadata(metadata, file)


def checked_metadata(metadata, file: Path) -> dict[str, Any]:
    """The metadata's five fields, each checked as CoMLRL checks them."""
    if not isinstance(metadata, dict) or not {"version", "trainer_class", "sequence"} <= set(metadata):
        raise ValueError(f"read_checkpoint_metadata: {file} lacks version, trainer_class or sequence.")
    version, trainer_class, sequence = metadata["version"], metadata["trainer_class"], metadata["sequence"]
    run_id, identity = metadata.get("run_id"), metadata.get("wandb")
    if type(version) is not int or version != CHECKPOINT_VERSION:
        raise ValueError(f"read_checkpoint_metadata: unsupported checkpoint version {version!r} in {file}.")
    if not isinstance(trainer_class, str) or not trainer_class:
        raise ValueError(f"read_checkpoint_metadata: invalid trainer_class {trainer_class!r} in {file}.")
    if type(sequence) is not int or sequence < 0:
        raise ValueError(f"read_checkpoint_metadata: invalid sequence {sequence!r} in {file}.")
    if run_id is not None and (not isinstance(run_id, str) or RUN_ID.fullmatch(run_id) is None):
        raise ValueError(f"read_checkpoint_metadata: invalid run_id {run_id!r} in {file}.")
    if identity is not None and (
        not isinstance(identity, dict)
        or not isinstance(identity.get("id"), str)
        or not identity["id"]
        or set(identity) - set(WANDB_KEYS)
        or not all(isinstance(value, str) for value in identity.values())
    ):
        raise ValueError(f"read_checkpoint_metadata: invalid W&B run identity {identity!r} in {file}.")
    return {
        "version": version,
        "trainer_class": trainer_class,
        "sequence": sequence,
        "run_id": run_id,
        "wandb": identity,
    }


def metadata_of(folder: Path) -> dict[str, Any] | None:
    """A checkpoint's metadata, or None for a folder without it (a TRL-face checkpoint, or none)."""
    return read_checkpoint_metadata(folder) if (folder / METADATA_NAME).is_file() else None


def numbered_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """The `checkpoint-{n}` folders in `root`, by number."""
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), path) for path in root.iterdir() if (m := NUMBERED.fullmatch(path.name))]
    return sorted((n, path) for n, path in found if path.is_dir() and not path.is_symlink())


def check_checkpoint_dir(root: Path, resumed: dict[str, Any] | None) -> None:
    """CoMLRL's rule before training into `root`: a new run needs no `checkpoint-{n}` there (it would replace another
    run's); a resumed run may replace only its own later checkpoints (same `run_id`)."""
    if root.exists() and not root.is_dir():
        raise NotADirectoryError(f"MAGRPOTrainer.train: checkpoint_dir {root} is not a directory.")
    for number, path in numbered_checkpoints(root):
        if resumed is None:
            raise FileExistsError(
                f"MAGRPOTrainer.train: checkpoint_dir already holds another run's checkpoint {path}; resume from a "
                "checkpoint (resume_from_checkpoint=...) or use an empty checkpoint_dir."
            )
        if number > resumed["sequence"]:
            check_own(path, resumed["run_id"])


def check_own(path: Path, run_id: str | None) -> None:
    """`path`, a checkpoint about to be replaced, must be this run's."""
    metadata = metadata_of(path)
    if metadata is None or run_id is None or metadata["run_id"] != run_id:
        raise FileExistsError(f"MAGRPOTrainer: refusing to replace {path}: it is not a checkpoint of this run.")


def replace_folder(written: Path, target: Path) -> None:
    """Put `written` at `target`; a folder already there goes only once the new one is in place."""
    backup = None
    if target.exists():
        backup = Path(tempfile.mkdtemp(prefix=f".{target.name}-old-", dir=target.parent))
        backup.rmdir()
        os.replace(target, backup)
    try:
        os.replace(written, target)
    except BaseException:
        if backup is not None:
            os.replace(backup, target)
        raise
    if backup is not None:
        shutil.rmtree(backup)


def prune(root: Path, latest: Path, limit: int | None, run_id: str) -> None:
    """CoMLRL's `checkpoint_total_limit`: of this run's checkpoints in `root`, the one just written and the
    `limit - 1` highest-numbered others stay (another run's are never touched)."""
    if limit is None:
        return
    own = [
        (number, path)
        for number, path in numbered_checkpoints(root)
        if path != latest and (metadata := metadata_of(path)) is not None and metadata["run_id"] == run_id
    ]
    for _, path in sorted(own, reverse=True)[limit - 1 :]:
        shutil.rmtree(path)
