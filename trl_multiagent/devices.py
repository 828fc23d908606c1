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
