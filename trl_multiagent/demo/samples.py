"""What the agents write: a few joint answers of each turn, with their joint rewards, at the first and the last step.

`SampleAnswers` is a `TrainerCallback` that reads them from the trainer's last rollout tree (`scored_answers`), prints
them when the first and the last step end (main process), and keeps them for a run's summary (`lines`).

>>> print("\\n".join(format_samples(3, {1: [(["A city of glass.", "Towers of cloud rise over a sea..."], 0.61)]})))
Sample joint answers at step 3:
  turn 1, reward 0.610
    agent 0: A city of glass.
    agent 1: Towers of cloud rise over a sea...
"""

from __future__ import annotations

from transformers import TrainerCallback


def one_line(text, width: int = 160) -> str:
    """A completion on one line, cut to `width` characters (chat completions: their text)."""
    if isinstance(text, list):  # a conversational completion: its messages
        text = " ".join(str(message.get("content", "")) for message in text)
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: width - 3] + "..."


def scored_answers(tree) -> dict[int, list]:
    """Each turn's joint answers with their joint rewards, as scored (in joint-action order), from a rollout tree
    (`rollout.RolloutTree`)."""
    samples: dict[int, list] = {}
    for action_id, action in enumerate(tree.joint_actions):
        samples.setdefault(tree.nodes[action.node].turn, []).append((tree.answers(action_id), action.reward))
    return samples


def format_samples(step: int, samples: dict[int, list], per_turn: int = 2) -> list[str]:
    """`per_turn` joint answers of each turn (as scored: the first ones), each agent's answer on a line."""
    lines = [f"Sample joint answers at step {step}:"]
    for turn, scored in sorted(samples.items()):
        for answers, reward in scored[:per_turn]:
            lines.append(f"  turn {turn}, reward {reward:.3f}")
            lines += [f"    agent {i}: {one_line(answer)}" for i, answer in enumerate(answers)]
    return lines


class SampleAnswers(TrainerCallback):
    """Print `per_turn` joint answers of each turn with their rewards at the end of the first and the last step.

    Args:
        trainer: the `MAGRPOTrainer` (its `last_rollout`, the tree of the step's generation).
        per_turn: joint answers shown per turn.
        printer: where the lines go (`print`).

    ```python
    samples = SampleAnswers(trainer)
    trainer.add_callback(samples)
    trainer.train()
    print("\\n".join(samples.lines()))  # both steps again, for the run's summary
    ```
    """

    def __init__(self, trainer, per_turn: int = 2, printer=print):
        self.trainer, self.per_turn, self.printer = trainer, per_turn, printer
        self.steps: dict[int, dict[int, list]] = {}

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step in (1, state.max_steps) and state.global_step not in self.steps:
            self.steps[state.global_step] = scored_answers(self.trainer.last_rollout)
            if state.is_world_process_zero:
                self.printer(
                    "\n".join(format_samples(state.global_step, self.steps[state.global_step], self.per_turn))
                )

    def lines(self) -> list[str]:
        """The recorded steps' samples, first step first."""
        return [line for step in sorted(self.steps) for line in format_samples(step, self.steps[step], self.per_turn)]
