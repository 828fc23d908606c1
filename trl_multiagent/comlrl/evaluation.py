"""CoMLRL 1.4.3's evaluation (`MAGRPOTrainer.evaluate(num_eval_samples=...)`), on the core's rollout.

CoMLRL evaluates the first `num_eval_samples` rows of `eval_dataset`, each along one path: one sampled answer per agent
per turn, every turn run (no early termination), the transition fed the chosen answers. It returns, and logs, only:

- ``eval/turn_{t}/reward_mean``: the mean over the rows of the joint reward at turn t;
- ``eval/turn_{t}/expected_return``: the mean over the rows of the undiscounted sum of the rewards from turn t on;
- ``eval/{key}`` for each key of ``eval_aggregator(eval_logger(...), num_turns=T)``, when both are given; the logger
  gets every evaluated row at once: ``agent_completions_turns[agent][row][turn]``, ``batch_items`` (the rows) and
  ``prompts`` (each row's ``prompt``).

Here the path is a rollout tree with one completion per agent and node (`MAGRPOTrainer.rollout(rows, 1)`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any


PREFIX = "eval/"  # CoMLRL's key prefix; the Trainer's logs say `eval_`, which wandb's callback writes as `eval/`


class Evaluation:
    """CoMLRL's `eval_logger` and `eval_aggregator`, given together, called as CoMLRL calls them."""

    def __init__(self, eval_logger: Callable, eval_aggregator: Callable):
        self.eval_logger, self.eval_aggregator = eval_logger, eval_aggregator

    @classmethod
    def from_arguments(cls, eval_logger, eval_aggregator) -> Evaluation | None:
        for name, func in (("eval_logger", eval_logger), ("eval_aggregator", eval_aggregator)):
            if func is not None and not callable(func):
                raise TypeError(f"MAGRPOTrainer: {name} must be callable, got {func!r}.")
        if (eval_logger is None) != (eval_aggregator is None):
            given = "eval_logger" if eval_logger is not None else "eval_aggregator"
            raise ValueError(
                f"MAGRPOTrainer: {given} is given alone; CoMLRL calls eval_logger and eval_aggregator together (the "
                "aggregator turns the logger's per-item metrics into the logged values). Pass both."
            )
        return None if eval_logger is None else cls(eval_logger, eval_aggregator)

    def metrics(self, paths: EvaluatedPaths, num_turns: int) -> dict[str, Any]:
        """``eval/{key}`` for each key the aggregator returns (its values as they are, as CoMLRL logs them)."""
        detailed = self.eval_logger(
            agent_completions_turns=paths.completions,
            batch_items=paths.rows,
            prompts=[row.get("prompt", "") for row in paths.rows],
        )
        aggregated = self.eval_aggregator(detailed, num_turns=num_turns)
        if not isinstance(aggregated, dict):
            raise TypeError(f"MAGRPOTrainer: eval_aggregator must return a dict of metrics, got {aggregated!r}.")
        return {f"{PREFIX}{key}": value for key, value in aggregated.items()}


@dataclass
class EvaluatedPaths:
    """The evaluated rows, in order: each agent's answer at each turn (`completions[agent][row][turn]`) and each row's
    joint reward at each turn (`rewards[row][turn]`)."""

    num_agents: int
    rows: list[dict] = field(default_factory=list)
    completions: list[list[list[str]]] = field(default_factory=list)
    rewards: list[list[float]] = field(default_factory=list)

    def __post_init__(self):
        self.completions = [[] for _ in range(self.num_agents)]

    def add(self, tree, rows: Sequence[dict]) -> None:
        """Each row's path through `tree`, a rollout with one completion per agent and node (its first joint answer,
        should a node hold more)."""
        roots = {node.row: node for node in tree.nodes if node.parent is None}
        for index, row in enumerate(rows):
            node, answers, rewards = roots[index], [[] for _ in range(self.num_agents)], []
            while node is not None:
                action = tree.joint_actions[node.joint_actions[0]]
                for agent in range(self.num_agents):
                    answers[agent].append(node.completions[agent][action.choice[agent]])
                rewards.append(float(action.reward))
                node = tree.nodes[action.child] if action.child is not None else None
            self.rows.append(row)
            for agent in range(self.num_agents):
                self.completions[agent].append(answers[agent])
            self.rewards.append(rewards)


def turn_metrics(rewards: list[list[float]], num_turns: int) -> dict[str, float]:
    """CoMLRL's per-turn values over the rows' reward paths: `reward_mean` (over the rows that reached the turn, 0.0
    if none did) and `expected_return`, the undiscounted sum from the turn on (a turn not reached adds 0.0)."""
    if not rewards:
        return {}
    metrics = {}
    for t in range(num_turns):
        reached = [path[t] for path in rewards if t < len(path)]
        metrics[f"{PREFIX}turn_{t + 1}/reward_mean"] = sum(reached) / len(reached) if reached else 0.0
        metrics[f"{PREFIX}turn_{t + 1}/expected_return"] = sum(sum(path[t:]) for path in rewards) / len(rewards)
    return metrics


def trainer_log_keys(metrics: dict[str, Any]) -> dict[str, Any]:
    """The metrics under the Trainer's evaluation prefix, `eval_`: its reporting callbacks take that prefix for
    evaluation (wandb's writes `eval_turn_1/reward_mean` as `eval/turn_1/reward_mean`, CoMLRL's key)."""
    return {f"eval_{key.removeprefix(PREFIX)}": value for key, value in metrics.items()}
