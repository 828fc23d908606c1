"""What the processes of a run agree on: whether a rollout goes on to another turn, and when gradients are reduced."""

from __future__ import annotations

import contextlib

import torch
from accelerate.utils import gather_object

from .rollout.tree import agreed, local_sync


def sync_turn(accelerator, has_live_nodes: bool, error: BaseException | None = None) -> bool:
    """Agreement across processes, at the end of each turn, after the resets of turn 1 and in each round of tool
    calls: go on if any process has live nodes (or calls left); a failure on any process stops all of them (the
    failing one re-raises its own error, the others name it), each raising an error marked `rollout.tree.AGREED`."""
    if accelerator.num_processes == 1:
        return local_sync(has_live_nodes, error)
    flags = torch.tensor([int(has_live_nodes), int(error is not None)], device=accelerator.device)
    live_anywhere, failures = accelerator.reduce(flags, reduction="sum").tolist()
    if failures:
        messages = gather_object([None if error is None else f"{type(error).__name__}: {error}"])
        if error is not None:
            raise agreed(error)
        failed = {rank: msg for rank, msg in enumerate(messages) if msg is not None}
        raise agreed(RuntimeError(f"MAGRPOTrainer: the rollout failed on process(es) {sorted(failed)}: {failed}"))
    return bool(live_anywhere)


@contextlib.contextmanager
def deferred_gradient_reduction(accelerator, model, deepspeed: bool):
    """No gradient reduction in this block: DDP's `no_sync`, and DeepSpeed outside its accumulation boundary
    (accelerate's backward then neither reduces nor steps the engine)."""
    state = accelerator.gradient_state
    sync_gradients = state.sync_gradients
    state._set_sync_gradients(False)
    try:
        with contextlib.nullcontext() if deepspeed else accelerator.no_sync(model):
            yield
    finally:
        state._set_sync_gradients(sync_gradients)


def max_over_processes(accelerator, value: int) -> int:
    """The largest `value` of any process (every process's row count per agent is padded to it)."""
    if accelerator.num_processes == 1:
        return value
    count = torch.tensor([value], device=accelerator.device)
    return int(accelerator.reduce(count, reduction="max").item())
