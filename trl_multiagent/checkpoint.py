"""Where each agent lives in a saved run, and how its weights are read back on resume."""

from __future__ import annotations

import os

import torch
from safetensors.torch import load_file
from transformers.trainer import load_sharded_checkpoint
from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME, WEIGHTS_INDEX_NAME, WEIGHTS_NAME


def agent_dir(output_dir: str, index: int) -> str:
    return os.path.join(output_dir, f"agent_{index}")


def agent_state_dict(team_state_dict: dict | None, index: int) -> dict | None:
    """The part of the team's state dict (keys ``agents.{i}.*``) that belongs to one agent, with that prefix removed."""
    if team_state_dict is None:
        return None
    prefix = f"agents.{index}."
    return {k[len(prefix) :]: v for k, v in team_state_dict.items() if k.startswith(prefix)}


def load_agent_weights(agent: torch.nn.Module, folder: str) -> None:
    """Load weights saved by `save_pretrained` into an existing agent, failing loudly on anything but tied weights."""
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"Checkpoint has no folder {folder!r} for this agent.")
    if any(os.path.isfile(os.path.join(folder, f)) for f in (SAFE_WEIGHTS_INDEX_NAME, WEIGHTS_INDEX_NAME)):
        load_sharded_checkpoint(agent, folder, strict=False, prefer_safe=True)
        return
    if os.path.isfile(os.path.join(folder, SAFE_WEIGHTS_NAME)):
        state = load_file(os.path.join(folder, SAFE_WEIGHTS_NAME))
    elif os.path.isfile(os.path.join(folder, WEIGHTS_NAME)):
        state = torch.load(os.path.join(folder, WEIGHTS_NAME), map_location="cpu", weights_only=True)
    else:
        raise FileNotFoundError(f"No model weights in {folder!r}.")
    result = agent.load_state_dict(state, strict=False)
    tied = set(getattr(agent, "all_tied_weights_keys", {}) or {}) | set(getattr(agent, "_tied_weights_keys", None) or [])
    missing = [k for k in result.missing_keys if k not in tied]
    if missing or result.unexpected_keys:
        raise RuntimeError(
            f"Checkpoint {folder!r} does not match the agent: missing {missing}, unexpected {result.unexpected_keys}."
        )


def load_adapter_weights(peft_model, folder: str, adapter_name: str) -> None:
    """Load a PEFT adapter saved in `folder` into `adapter_name` of `peft_model`, leaving it trainable."""
    from peft import set_peft_model_state_dict

    path = os.path.join(folder, "adapter_model.safetensors")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"No adapter weights in {folder!r}.")
    result = set_peft_model_state_dict(peft_model, load_file(path), adapter_name=adapter_name)
    unexpected = getattr(result, "unexpected_keys", [])
    if unexpected:
        raise RuntimeError(f"Adapter {folder!r} does not match agent adapter {adapter_name!r}: unexpected {unexpected}.")
