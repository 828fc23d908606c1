"""Whether this machine has an accelerator: the one predicate the package uses for its CPU defaults."""

from __future__ import annotations

import functools

import torch


@functools.cache
def has_accelerator() -> bool:
    """True when a CUDA or XPU device is available to torch (cached: it does not change within a process)."""
    if torch.cuda.is_available():
        return True
    xpu = getattr(torch, "xpu", None)
    return bool(xpu is not None and xpu.is_available())


# glibc's `mallopt` parameters (malloc.h) and the variables through which a user sets the allocator up instead
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4
_USER_ALLOCATOR_VARIABLES = ("MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES")


@functools.cache
def reuse_freed_memory() -> str:
    """On a CPU, make glibc's malloc keep the memory the update frees, for the update's next tensors.

    Why: glibc serves every allocation above 32 MiB (the most its mmap threshold can rise to) with a fresh `mmap`,
    and unmaps it when freed. The update's largest tensors (a chunk's logits over the vocabulary and their gradients,
    50 MB and more for SmolLM2) are such allocations, so every step touches gigabytes of new pages: measured on
    SmolLM2-135M (2 agents, 40 rows each, benchmarks/bench_limit.py), 4-5.5 million page faults per update and
    45-60 s, against 38-42 s in the rare state where the heap already held the memory. How many faults a step takes
    depends on the process's past (colocated vLLM engines built and freed in it shifted it: the update looked slower
    with engines alive). With `mmap` off for malloc (`M_MMAP_MAX=0`) and the heap never trimmed
    (`M_TRIM_THRESHOLD` at its maximum), large blocks come from the heap and a freed block serves the next request:
    0.6-1.1 million faults, 37-42 s per update, with or without engines. The process keeps its peak memory.

    Left alone (and said why) with an accelerator (the update's tensors are on it), without glibc, or when the user
    set the allocator up (`MALLOC_MMAP_MAX_`, `MALLOC_TRIM_THRESHOLD_`, `MALLOC_MMAP_THRESHOLD_`, `GLIBC_TUNABLES`,
    or another allocator in `LD_PRELOAD`). Returns what was done, once per process.
    """
    import ctypes
    import os
    import platform

    from transformers.utils import logging

    logger = logging.get_logger(__name__)
    user = [name for name in _USER_ALLOCATOR_VARIABLES if name in os.environ]
    if "malloc" in os.environ.get("LD_PRELOAD", ""):
        user.append("LD_PRELOAD")
    if has_accelerator():
        return "left: the update runs on an accelerator"
    if user or platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        done = f"left as set by {', '.join(user)}" if user else "left: not glibc"
        logger.info_once(f"trl_multiagent: malloc {done}.")
        return done
    libc = ctypes.CDLL(None)
    if not (libc.mallopt(_M_MMAP_MAX, 0) and libc.mallopt(_M_TRIM_THRESHOLD, 2**31 - 1)):
        return "left: mallopt refused"
    logger.info_once(
        "trl_multiagent: on this CPU, malloc keeps freed memory for reuse (M_MMAP_MAX=0, M_TRIM_THRESHOLD max): the "
        "update's large tensors would otherwise page-fault on every step. Set MALLOC_MMAP_MAX_ (any value) to keep "
        "glibc's own behaviour."
    )
    return "set"
