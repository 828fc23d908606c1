"""`environment_factory`'s rules for the other arguments: the placeholder rows when the environment owns the data,
and the joint mode its worlds need."""

from __future__ import annotations

from datasets import Dataset

from ..rollout.task import EMPTY_CHAT


def placeholder_dataset(args, worlds) -> Dataset:
    """TRL's rule when an environment owns the data (no `train_dataset`): `max_steps` sets the length, and rows of
    empty chat prompts, one generation's worth, drive the loop; each root's `reset` writes its task."""
    if worlds.routed:
        raise ValueError(
            "MAGRPOTrainer: a dict `environment_factory` (several environments) requires a `train_dataset` with an "
            "'environment' column to route each row to its environment, as in TRL. Pass one, or a single factory."
        )
    if args.max_steps <= 0:
        raise ValueError(
            "MAGRPOTrainer: without a `train_dataset` (the environment owns the data and `reset()` writes the "
            "prompt), `max_steps` sets the training length: set MAGRPOConfig(max_steps=...), as TRL asks."
        )
    rows = max(args.generation_batch_size // args.num_generations, 1)
    return Dataset.from_dict({"prompt": [EMPTY_CHAT] * rows})


def check_joint_mode_for_worlds(args, worlds) -> None:
    """A world is acted on by the agents of one joint action in turn; `cross` pairs each completion with K^(N-1)
    joint actions, whose worlds differ, so one completion would have acted on several worlds."""
    if worlds is not None and args.joint_mode != "aligned":
        raise ValueError(
            f"MAGRPOTrainer: environment_factory needs joint_mode='aligned' (got {args.joint_mode!r}): in a joint "
            "action every agent acts on that joint action's world, and with 'cross' each completion would belong to "
            "several joint actions, hence several worlds. Set MAGRPOConfig(joint_mode='aligned'), or give the agents "
            "plain `tools=` (functions without a shared world), which work with 'cross'."
        )
