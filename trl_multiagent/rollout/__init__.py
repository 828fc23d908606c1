"""The rollout (floor 3): the team's tree (`tree`), the tools agents call inside a turn (`tools`) and the task's
functions behind the rollout's calls (`task`). `from trl_multiagent.rollout import run_rollout, RolloutTree,
Generation` keeps working."""

from ..generation.output import Generation
from .tree import JointAction, Node, RolloutTree, local_sync, run_rollout


__all__ = ["Generation", "JointAction", "Node", "RolloutTree", "local_sync", "run_rollout"]
