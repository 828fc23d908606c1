"""The rollout trees of the logged steps, recorded for `python -m trl_multiagent.view` and the trackers."""

from .record import FORMAT_VERSION, tree_records
from .store import TreeRecorder, read_step, step_files


__all__ = ["FORMAT_VERSION", "TreeRecorder", "read_step", "step_files", "tree_records"]
