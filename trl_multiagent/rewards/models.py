"""Reward models (sequence-classification models in `reward_funcs`, scored as GRPOTrainer scores them) and the name
each reward source has in the logs, as TRL names it."""

from __future__ import annotations

import torch
from trl.data_utils import apply_chat_template

from ..callables import callable_name


def reward_name(func) -> str:
    """As TRL names it: a model by its config's name (its last path part), a function by its name."""
    if isinstance(func, str):
        return func.rstrip("/").split("/")[-1]
    if isinstance(func, torch.nn.Module):
        return str(getattr(func.config, "_name_or_path", "") or type(func).__name__).rstrip("/").split("/")[-1]
    return callable_name(func)


@torch.inference_mode()
def score_with_model(model, tokenizer, prompts: list, completions: list[str], conversational: bool) -> list[float]:
    """A sequence-classification reward model's score of each prompt + completion, as GRPOTrainer computes it."""
    if conversational:
        texts = [
            apply_chat_template({"messages": p + [{"role": "assistant", "content": c}]}, tokenizer)["text"]
            for p, c in zip(prompts, completions, strict=True)
        ]
    else:
        texts = [p + c for p, c in zip(prompts, completions, strict=True)]
    inputs = tokenizer(text=texts, return_tensors="pt", padding=True, padding_side="right", add_special_tokens=False)
    device = next(model.parameters()).device
    return model(**inputs.to(device)).logits[:, 0].float().tolist()
