"""What the processes of a run agree on: whether a rollout goes on to another turn, and when gradients are reduced;
and the release of the process groups when the process exits."""

from __future__ import annotations

import atexit
import contextlib
import gc
import types
import weakref

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


_END_AT_EXIT: list = []  # weak references to the trainers whose `end()` runs at exit (registered once per process)
_HAD_GROUPS: list = []  # True once a trainer trained with process groups: only then are their leftovers looked for


def end_at_exit(trainer) -> None:
    """Run `trainer.end()` (Trainer's own release: `accelerator.end_training()`, which destroys every process group)
    when the interpreter exits, if the script did not call it.

    Not at the end of `train()`: `save_model`, `evaluate` and `push_to_hub` after `train()` still need the groups (a
    ZeRO-3 save gathers the shards). Left to interpreter finalisation, a gloo thread still held by a DeepSpeed group
    aborts a finished run ("terminate called without an active exception", pytorch/pytorch#179291), so a successful
    script would exit non-zero. `atexit` runs while the interpreter is still whole; after an explicit `trainer.end()`
    there is nothing left to destroy. Either way, the groups that function defaults still hold are let go and
    collected then (`release_groups_held_as_defaults`), so that their gloo threads end before the interpreter does.
    The reference is weak, so this keeps no trainer alive.
    """
    if not _END_AT_EXIT:
        atexit.register(_end_trainers)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        _HAD_GROUPS.append(True)
    if not any(ref() is trainer for ref in _END_AT_EXIT):
        _END_AT_EXIT.append(weakref.ref(trainer))


def _end_trainers() -> None:
    for ref in _END_AT_EXIT:
        _end(ref)  # in a function of its own: no local name keeps a trainer alive through the collection below
    # A trainer already collected leaves its groups behind: they belong to torch, not to the trainer.
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    if _HAD_GROUPS:
        release_groups_held_as_defaults()
        gc.collect()  # a destroyed group still in a reference cycle is freed now, and its gloo threads joined


def _end(ref: weakref.ref) -> None:
    if (trainer := ref()) is not None:
        trainer.end()


def release_groups_held_as_defaults() -> int:
    """Put None in place of every process group that a function holds as a default argument; returns how many
    functions held one. Called at exit, after the groups were destroyed.

    Why: a signature such as `barrier(self, group=torch.distributed.GroupMember.WORLD)` (DeepSpeed 0.19's
    `TorchBackend.barrier` and `monitored_barrier`; torch's own `torch.distributed.nn.functional` collectives) evaluates
    its default when its module is imported. Imported after the world group was made (transformers and accelerate
    import DeepSpeed while preparing a run, with or without ZeRO), the default keeps that group, and its gloo threads,
    alive after `destroy_process_group()`, into the interpreter's finalisation and `exit()`, while the other processes
    close their sockets. The slow multi-process tests' rare exit-time aborts ("terminate called without an active
    exception") all came after this point with those threads alive. These functions read `group=None` as the current
    world group, so None is the same default (and a destroyed group would fail anyway); the group is then freed
    (`_end_trainers` collects what was left in reference cycles) and its threads joined while the interpreter is
    whole. `tests/test_private_api_contract.py` checks it on DeepSpeed's.
    """

    def is_group(value) -> bool:  # by exact type: `isinstance` asks for `__class__`, which some objects warn about
        return issubclass(type(value), torch.distributed.ProcessGroup)

    held = 0
    for function in gc.get_objects():
        if type(function) is not types.FunctionType:
            continue
        defaults, keyword_defaults = function.__defaults__ or (), function.__kwdefaults__ or {}
        if any(is_group(d) for d in (*defaults, *keyword_defaults.values())):
            function.__defaults__ = tuple(None if is_group(d) else d for d in defaults) or None
            if keyword_defaults:
                function.__kwdefaults__ = {k: None if is_group(d) else d for k, d in keyword_defaults.items()}
            held += 1
    return held
