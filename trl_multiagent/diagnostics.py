"""Runs that cannot learn say so: a WARNING when a logged step had no learning signal, and when turns were skipped.

Both read only the values a step logs (`loss`, `grad_norm`, `frac_reward_zero_std`, `tools/call_frequency`,
`turn_{t}/...`): the metrics stay as they are, and these lines say what they mean in this package's terms.

>>> blockers({"loss": 0.0, "grad_norm": 0.0, "frac_reward_zero_std": 1.0, "reward_std": 0.0, "reward": 0.0})
['every group of K answers scored the same (frac_reward_zero_std = 1.0), so every advantage is 0', 'the loss and the gradient norm are 0']
>>> blockers({"loss": 0.01, "grad_norm": 0.3, "frac_reward_zero_std": 0.5})
[]
"""

from __future__ import annotations

from transformers import TrainerCallback
from transformers.utils import logging


logger = logging.get_logger(__name__)

TOOL_RECIPE_HINT = (
    "a small model needs the call spelled out in its prompt, generation stopped after the call "
    "(generation_kwargs={'stop_strings': ['</tool_call>']}) and a reward for a call that ran: recipes/tool_team.py "
    "does all three"
)


def trainable_lengths(logs: dict, trainable_agents) -> list[float]:
    """The logged mean completion length (model tokens) of each trainable agent that has one."""
    keys = (f"agent_{i}/completions/mean_length" for i in trainable_agents)
    return [logs[key] for key in keys if key in logs]


def blockers(logs: dict, trainable_agents=(), mask_truncated_completions: bool = False) -> list[str]:
    """What kept a logged training step from learning, from its logged values; empty when nothing did."""
    found = []
    if logs.get("frac_reward_zero_std") == 1.0:
        found.append("every group of K answers scored the same (frac_reward_zero_std = 1.0), so every advantage is 0")
    lengths = trainable_lengths(logs, trainable_agents)
    no_model_tokens = bool(lengths) and all(n == 0 for n in lengths)
    if no_model_tokens or (mask_truncated_completions and logs.get("completions/clipped_ratio") == 1.0):
        found.append("no completion of a trainable agent had a token in the loss")
    if logs.get("loss") == 0.0 and logs.get("grad_norm") == 0.0:
        found.append("the loss and the gradient norm are 0")
    return found


def likely_causes(logs: dict, num_turns: int, mask_truncated_completions: bool = False) -> list[str]:
    """The causes the logged values point at, in this package's terms."""
    causes = []
    if logs.get("reward_std") == 0.0:
        causes.append(f"a constant reward: every joint answer of the step scored {logs.get('reward', 0.0):.4g}")
    elif logs.get("frac_reward_zero_std") == 1.0:
        causes.append(
            "a saturated or coarse reward: it differs between prompts but not between the K answers to one prompt "
            "(at its ceiling or floor, or unable to tell the answers apart)"
        )
    if logs.get("tools/call_frequency") == 0.0:
        causes.append(
            f"with tools, no tool call was parsed in any completion (tools/call_frequency = 0): {TOOL_RECIPE_HINT}"
        )
    if num_turns > 1 and logs.get("turn_1/terminated_frac") == 1.0:
        causes.append(
            "early termination: every node ended after turn 1 (turn_1/terminated_frac = 1.0; see "
            "early_termination_threshold)"
        )
    if mask_truncated_completions and logs.get("completions/clipped_ratio") == 1.0:
        causes.append(
            "every completion reached max_completion_length and mask_truncated_completions=True drops them all"
        )
    return causes or ["none that the logged values show; see docs/metrics.md"]


def deepest_turn(logs: dict, num_turns: int) -> int:
    """The last turn that has a logged reward in this step (0 when none has)."""
    return max((t for t in range(1, num_turns + 1) if f"turn_{t}/reward_mean" in logs), default=0)


class LearningSignalCallback(TrainerCallback):
    """Says at WARNING when a logged training step cannot learn (once, then again only when what blocks it changes),
    and, after the first logged step, when later turns never ran."""

    def __init__(self, num_turns: int, trainable_agents, early_termination_threshold, mask_truncated_completions):
        self.num_turns, self.trainable_agents = num_turns, tuple(trainable_agents)
        self.threshold, self.mask_truncated = early_termination_threshold, mask_truncated_completions
        self.said: tuple[str, ...] = ()
        self.checked_turns = False

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or not state.is_world_process_zero or "reward" not in logs:  # eval logs are `eval_reward`
            return
        if not self.checked_turns:
            self.checked_turns = True
            self.say_skipped_turns(logs, state.global_step)
        found = tuple(blockers(logs, self.trainable_agents, self.mask_truncated))
        if found and found != self.said:
            causes = "; ".join(likely_causes(logs, self.num_turns, self.mask_truncated))
            logger.warning(
                f"MAGRPOTrainer: step {state.global_step} cannot learn: {'; '.join(found)}. Likely causes: {causes}. "
                "(Said again only when this changes.)"
            )
        self.said = found

    def say_skipped_turns(self, logs: dict, step: int) -> None:
        reached = deepest_turn(logs, self.num_turns)
        if 0 < reached < self.num_turns and logs.get(f"turn_{reached}/terminated_frac") == 1.0:
            logger.warning(
                f"MAGRPOTrainer: num_turns={self.num_turns}, but turn {reached + 1} never ran in step {step}: every "
                f"node of turn {reached} ended early (turn_{reached}/terminated_frac = 1.0), its mean joint reward "
                f"being above early_termination_threshold={self.threshold}. Set early_termination_threshold=None to "
                "run every turn."
            )
