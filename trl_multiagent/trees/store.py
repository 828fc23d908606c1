"""The recorded trees on disk: `TreeRecorder` gathers every process's records at the steps it keeps and writes one
file per step, ``<output_dir>/rollout_trees/step_{step:05d}.json.gz``, on the main process; `read_step` and
`step_files` read them back (`python -m trl_multiagent.view`)."""

from __future__ import annotations

import gzip
import json
import os
import re
import time

from .record import FORMAT_VERSION, tree_records
from .wandb_table import log_tree_table


FOLDER = "rollout_trees"
STEP_FILE = re.compile(r"step_(\d+)\.json\.gz$")


class TreeRecorder:
    """Records the training trees of the steps that `MAGRPOConfig.log_rollout_trees` and `rollout_trees_steps` keep.

    `record` must be called on every process at the same point (it gathers with `gather_object`, one collective, as
    the metrics are gathered); only the main process writes. Evaluation trees are not recorded.
    """

    def __init__(self, args, accelerator, max_completion_length: int):
        self.enabled = bool(getattr(args, "log_rollout_trees", False))
        self.every = getattr(args, "rollout_trees_steps", None)
        self.max_chars = getattr(args, "rollout_trees_max_chars", 2000)
        self.args, self.accelerator, self.max_completion_length = args, accelerator, max_completion_length
        self.folder = os.path.join(args.output_dir, FOLDER)
        self._step, self._prompts = None, []  # the step being written: a step with several generations appends

    def due(self, mode: str, state) -> bool:
        """Whether the tree generated now (for optimizer step ``state.global_step + 1``) is kept: every
        `rollout_trees_steps` steps, or when None every step the Trainer logs (`logging_steps`, and the first step
        with `logging_first_step`; every step under another `logging_strategy`). The same on every process."""
        if not self.enabled or mode != "train":
            return False
        step = state.global_step + 1
        if self.every:
            return step % self.every == 0
        if str(getattr(self.args.logging_strategy, "value", self.args.logging_strategy)) != "steps":
            return True
        every = state.logging_steps or 1
        return step % every == 0 or (step == 1 and self.args.logging_first_step)

    def record(self, tree, returns, credited, advantages, task_record, mode: str, state) -> str | None:
        """Gather this generation's tree (with its `rollout.task.TaskRecord`) from every process and write its step's
        file; returns the path (main process) or None."""
        if not self.due(mode, state):
            return None
        from accelerate.utils import gather_object  # here: `read_step` and `step_files` serve the viewer without torch

        local = tree_records(
            tree, returns, credited, advantages, task_record,
            max_completion_length=self.max_completion_length, max_chars=self.max_chars,
            process_index=self.accelerator.process_index,
        )  # fmt: skip
        gathered = gather_object(local)
        if not self.accelerator.is_main_process:
            return None
        step = state.global_step + 1
        if step != self._step:
            self._step, self._prompts = step, []
        self._prompts.extend(gathered)
        num_agents = len(tree.nodes[0].completions) if tree.nodes else 0
        document = {
            "format_version": FORMAT_VERSION,
            "step": step,
            "time": time.time(),
            "num_agents": num_agents,
            "num_generations": len(tree.nodes[0].completions[0]) if tree.nodes else 0,
            "num_turns": self.args.num_turns,
            "discount": self.args.discount,
            "early_termination_threshold": self.args.early_termination_threshold,
            "reward_names": list(task_record.reward_names),
            "max_text_chars": self.max_chars,
            "prompts": self._prompts,
        }
        path = write_step(self.folder, document)
        if self.args.report_to and "wandb" in self.args.report_to:
            log_tree_table(document)
        return path


def write_step(folder: str, document: dict) -> str:
    """Write one step's document, compact JSON gzip-compressed, through a temporary file (a reader never sees half)."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"step_{document['step']:05d}.json.gz")
    partial = path + ".partial"
    with gzip.open(partial, "wt", encoding="utf-8", compresslevel=6) as f:
        json.dump(document, f, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    os.replace(partial, path)
    return path


def step_files(run_dir: str) -> dict[int, str]:
    """Step -> file of the trees recorded in a run folder (``<run_dir>/rollout_trees/``), in step order."""
    folder = os.path.join(run_dir, FOLDER)
    if not os.path.isdir(folder):
        return {}
    found = {
        int(m.group(1)): os.path.join(folder, name) for name in os.listdir(folder) if (m := STEP_FILE.match(name))
    }
    return dict(sorted(found.items()))


def read_step(path: str) -> dict:
    """One step's document; a file of another format version is refused, naming both versions."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        document = json.load(f)
    version = document.get("format_version")
    if version != FORMAT_VERSION:
        raise ValueError(
            f"{path}: rollout tree format_version {version!r}; this trl_multiagent reads version {FORMAT_VERSION}."
        )
    return document
