"""Whether this machine has an accelerator (the one predicate the package uses for its CPU defaults), and
`reuse_freed_memory`, an opt-in for the caller's own process that the package never calls."""

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


# glibc's `mallopt` parameters (malloc.h) and the variables through which the allocator is set up before a process starts
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4
_ALLOCATOR_VARIABLES = ("MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES")


@functools.cache
def reuse_freed_memory() -> str:
    """On a CPU, make this process's glibc malloc keep the memory it frees, for the next large tensors. Opt-in: the
    trainer never calls it; the recipes, the benchmarks and the test suite do, and so may a CPU user's script.

    It changes the allocator of the whole process, for good, so call it at the start of a script, not from a library.
    The same setting from the shell, before Python starts (glibc reads these variables only at start-up)::

        MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=2147483647 python train.py

    Why: glibc serves every allocation above 32 MiB (the most its mmap threshold can rise to) with a fresh `mmap`,
    and unmaps it when freed. The update's largest tensors (a chunk's logits over the vocabulary and their gradients,
    50 MB and more for SmolLM2) are such allocations, so every step touches gigabytes of new pages. With `mmap` off for
    malloc (`M_MMAP_MAX=0`) and the heap never trimmed (`M_TRIM_THRESHOLD` at its maximum), large blocks come from the
    heap and a freed block serves the next request; the process keeps its peak memory. What it is worth on an update
    is measured in docs/benchmarks.md ("The allocator on a CPU").

    Does nothing (and says why) with an accelerator (the update's tensors are on it), without glibc, or when the
    allocator was set up already (`MALLOC_MMAP_MAX_`, `MALLOC_TRIM_THRESHOLD_`, `MALLOC_MMAP_THRESHOLD_`,
    `GLIBC_TUNABLES`, or another allocator in `LD_PRELOAD`). Returns what was done: `"set"`, or why it was left.

    Example:

    ```python
    from trl_multiagent.devices import reuse_freed_memory

    reuse_freed_memory()  # first thing in a CPU training script
    ```
    """
    import ctypes
    import os
    import platform

    from transformers.utils import logging

    logger = logging.get_logger(__name__)
    set_up = [name for name in _ALLOCATOR_VARIABLES if name in os.environ]
    if "malloc" in os.environ.get("LD_PRELOAD", ""):
        set_up.append("LD_PRELOAD")
    if has_accelerator():
        done = "left: the update runs on an accelerator"
    elif set_up or platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        done = f"left as set by {', '.join(set_up)}" if set_up else "left: not glibc"
    else:
        libc = ctypes.CDLL(None)
        done = (
            "set" if libc.mallopt(_M_MMAP_MAX, 0) and libc.mallopt(_M_TRIM_THRESHOLD, 2**31 - 1) else "left: refused"
        )
    logger.info(f"trl_multiagent.devices.reuse_freed_memory: malloc {done}.")
    return done
