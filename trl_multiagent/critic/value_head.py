"""A value head, and the hidden state it reads from a causal LM: the last layer's, at the last token of the sequence
given, as CoMLRL 1.4.3's `CausalLMWithValueHead` reads it.

What the sequence holds says what the value is: the history (the prompt) for V(h), the history and the answer for
Q(h, a). In one forward over prompt and completion, V(h) is read at the prompt's last position instead: a causal
model's hidden state there has not seen the completion, so it is the one a forward over the prompt alone gives.
"""

from __future__ import annotations

import torch
from torch import nn


class ValueHead(nn.Module):
    """A linear map from a hidden state to one value, with CoMLRL's optional ``hidden_dim`` projection (its
    `value_head_hidden_dim`: a linear layer and tanh first). Weights start as CoMLRL's do, normal with std 0.02 and
    zero biases, so that the first values are near 0.

    >>> head = ValueHead(hidden_size=8)
    >>> head(torch.zeros(3, 8))
    tensor([0., 0., 0.], grad_fn=<SqueezeBackward1>)
    """

    def __init__(self, hidden_size: int, hidden_dim: int | None = None) -> None:
        super().__init__()
        layers = [nn.Linear(hidden_size, hidden_dim), nn.Tanh()] if hidden_dim else []
        self.layers = nn.Sequential(*layers, nn.Linear(hidden_dim or hidden_size, 1))
        for layer in self.layers:
            if isinstance(layer, nn.Linear):
                nn.init.normal_(layer.weight, std=0.02)
                nn.init.zeros_(layer.bias)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """``(..., hidden_size)`` -> ``(...)``, in the head's dtype (a float32 head reads a bfloat16 backbone)."""
        return self.layers(hidden_states.to(self.layers[-1].weight.dtype)).squeeze(-1)


def last_token_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """The position of each row's last attended token, whether the padding is on the left (TRL's prompts) or on the
    right (its completions).

    >>> last_token_positions(torch.tensor([[0, 1, 1], [1, 1, 0], [1, 0, 0]]))
    tensor([2, 1, 0])
    """
    if attention_mask.dim() != 2 or not bool(attention_mask.bool().any(dim=1).all()):
        raise ValueError(
            "last_token_positions: attention_mask must be (batch, length) with at least one token per row, got "
            f"shape {tuple(attention_mask.shape)}."
        )
    length = attention_mask.size(1)
    return length - 1 - attention_mask.bool().flip(1).int().argmax(dim=1)


def last_hidden(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    positions: torch.Tensor | None = None,
) -> torch.Tensor:
    """``(batch, hidden_size)``: a causal LM's last-layer hidden state at `positions`, by default each row's last
    attended token (`last_token_positions`). The value is ``head(last_hidden(...))``; detach the hidden states to
    train the head alone.

    The LM runs with ``output_hidden_states=True`` (its logits are computed too, as in CoMLRL): on the actor itself,
    reading the policy's forward instead, or a critic without its LM head, is the trainer's choice.
    """
    outputs = model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
    hidden = outputs.hidden_states[-1]
    if positions is None:
        positions = last_token_positions(attention_mask)
    return hidden[torch.arange(hidden.size(0), device=hidden.device), positions.to(hidden.device)]
