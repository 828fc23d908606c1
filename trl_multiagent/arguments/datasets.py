"""The datasets, before anything is loaded: rows, a 'prompt' column (or what writes the prompts), no blank prompt,
enough prompts for one step, and no column named like a keyword the trainer passes."""

from __future__ import annotations

from datasets import Dataset
from trl.data_utils import is_conversational

from ..callables import check_prompt


def named_eval_datasets(eval_dataset) -> list[tuple[str, object]]:
    """`eval_dataset` as (name, dataset) pairs: one, or each of a dict of them (a `DatasetDict` too), which Trainer
    evaluates one by one (`eval_{name}_*` keys).

    >>> [name for name, _ in named_eval_datasets({"easy": None, "hard": None})]
    ["eval_dataset['easy']", "eval_dataset['hard']"]
    """
    if isinstance(eval_dataset, dict):
        return [(f"eval_dataset[{key!r}]", dataset) for key, dataset in eval_dataset.items()]
    return [("eval_dataset", eval_dataset)]


def check_dataset(name: str, dataset, has_formatters: bool, has_worlds: bool = False) -> None:
    """Before anything is loaded: the dataset has rows, a 'prompt' column (or formatters, or an environment whose
    `reset` writes the task, as in TRL), and no blank prompt."""
    columns = getattr(dataset, "column_names", None)
    if columns is None:  # no dataset, or an iterable one: its rows are checked as they are read
        return
    if isinstance(dataset, Dataset) and len(dataset) == 0:
        raise ValueError(f"MAGRPOTrainer: {name} is empty (0 rows); it needs at least one prompt.")
    if has_worlds or ("prompt" not in columns and has_formatters):
        return  # the environment's `reset`, or the formatters, write the prompts
    if "prompt" not in columns:
        raise ValueError(
            f"MAGRPOTrainer: {name} has no 'prompt' column (columns: {columns}). Add one, or pass "
            "`formatters=` to build each agent's prompt from a row."
        )
    if isinstance(dataset, Dataset) and not has_formatters:
        for index, prompt in enumerate(dataset["prompt"]):
            check_prompt(f"MAGRPOTrainer: {name} row {index}'s 'prompt'", prompt, conversational=True)


def check_dataset_fills_a_step(dataset, args) -> None:
    """A dataset with fewer prompts than one generation takes would give the HF Trainer no step at all (its error,
    "args.max_steps must be set to a positive value", names neither the dataset nor the batch)."""
    if not isinstance(dataset, Dataset) or args.max_steps > 0:
        return
    prompts = args.generation_batch_size // args.num_generations  # over all processes
    if len(dataset) < prompts:
        raise ValueError(
            f"MAGRPOTrainer: train_dataset has {len(dataset)} prompt(s), but one generation takes {prompts} "
            f"(generation_batch_size {args.generation_batch_size} / num_generations {args.num_generations}), so no "
            f"step would run. Set per_device_train_batch_size={args.num_generations} (one prompt per step, as CoMLRL "
            "trains) with gradient_accumulation_steps=1, or add prompts."
        )


def check_column_names(columns, reserved) -> None:
    """A dataset column named like a keyword the trainer passes would silently replace that value."""
    clashes = sorted(set(columns) & set(reserved))
    if clashes:
        raise ValueError(
            f"MAGRPOTrainer: the dataset column(s) {clashes} have the name of a keyword the trainer passes to the "
            f"reward and the transition ({sorted(reserved)}); rename the column(s)."
        )


def is_conversational_dataset(dataset) -> bool:
    if dataset is None or "prompt" not in (getattr(dataset, "column_names", None) or []):
        return False
    first = next(iter(dataset), None)
    return first is not None and is_conversational(first)
