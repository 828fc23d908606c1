"""The first rows, once the tokenizers are loaded: their prompts (formatters, chat templates, chat messages for agents
that act), and one placeholder call of the user's functions (`check_functions_before_training`)."""

from __future__ import annotations

from datasets import Dataset, IterableDataset
from trl.data_utils import is_conversational

from ..callables import short_repr


def check_first_rows(task, train_dataset, eval_dataset, args, acts: bool = False) -> None:
    """The first rows' prompts (formatters, chat templates; chat messages when the agents act: `acts`), and one
    placeholder call of the user's functions."""
    if isinstance(eval_dataset, (Dataset, IterableDataset)):
        eval_row = next(iter(eval_dataset), None)
        if eval_row is not None:
            check_acting_prompts(task.first_prompts(eval_row), acts)
    if train_dataset is None:
        return
    first_row = next(iter(train_dataset))  # `user_functions` refused an empty one
    prompts = task.first_prompts(first_row)
    check_acting_prompts(prompts, acts)
    if args.check_functions_before_training:
        task.check_functions(first_row, prompts, args.num_turns)


def check_acting_prompts(prompts: list, acts: bool) -> None:
    """Tool calls are parsed from chat turns (TRL's `parse_response`): agents with tools need chat prompts."""
    if acts and not all(is_conversational({"prompt": p}) for p in prompts):
        raise ValueError(
            "MAGRPOTrainer: `tools` and `environment_factory` need chat prompts (lists of messages), as in TRL: tool "
            "calls are read from the assistant's turn and results come back as tool messages. The first prompts are "
            f"plain text ({short_repr(prompts[0], 80)}); write the dataset's 'prompt' as "
            '[{"role": "user", "content": ...}], or return messages from `formatters`.'
        )
