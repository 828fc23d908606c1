"""The TRL releases the package runs on (pyproject.toml: `trl>=1.15,<1.17`, docs/versions.md), and the two things
that need TRL 1.16, refused by name on 1.15 before anything runs:

- tool calling: TRL 1.16's `parse_response` types each tool call's arguments with the calling tool's JSON schema
  (`tools=`); 1.15's guesses them with a lenient JSON parse, so `"75001"` and `75001` could reach a tool alike;
- log-probs on a device without Triton kernels: TRL 1.15's fused log-prob head (`add_fused_lm_head`) runs only Triton
  kernels, on CUDA or XPU (or in Triton's interpreter, `TRITON_INTERPRET=1`, as CI runs 1.15 on CPU); 1.16's also runs
  on plain torch.
"""

from __future__ import annotations

import importlib.util
import os

import trl
from packaging.version import Version


TRL_VERSION = Version(trl.__version__)
NEWEST = Version("1.16")  # the release whose features the package uses in full


def require_newest_trl(feature: str, why: str) -> None:
    """Refuse `feature` on a TRL older than 1.16, naming it, the reason and the install line."""
    if TRL_VERSION < NEWEST:
        raise ValueError(
            f"MAGRPOTrainer: {feature} needs trl>=1.16 ({why}); installed: trl {TRL_VERSION}. Install it with "
            "`pip install 'trl>=1.16,<1.17'`."
        )


def require_fused_head_kernels(device_type: str) -> None:
    """On TRL 1.15, refuse a process whose log-probs TRL's Triton-only fused head cannot compute (see above)."""
    triton = importlib.util.find_spec("triton") is not None
    runs = triton and (device_type in ("cuda", "xpu") or os.environ.get("TRITON_INTERPRET") == "1")
    if not runs:
        require_newest_trl(
            f"computing log-probs on {device_type}{'' if triton else ' without triton'}",
            f"trl {TRL_VERSION}'s fused log-prob head runs only Triton kernels, on CUDA or XPU; 1.16's also runs "
            "on plain torch",
        )
