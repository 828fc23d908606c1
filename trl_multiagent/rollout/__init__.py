"""The rollout: the team's tree (`tree`), the tools agents call inside a turn (`tools`) and the environments they act
on (`worlds`). `from trl_multiagent.rollout import run_rollout, RolloutTree, Generation` keeps working."""

from ..generation.output import Generation
from .tree import JointAction, Node, RolloutTree, local_sync, run_rollout


__all__ = ["Generation", "JointAction", "Node", "RolloutTree", "local_sync", "run_rollout"]
