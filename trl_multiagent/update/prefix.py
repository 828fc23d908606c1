"""Rows that share a prompt run that prompt through the model once.

In a rollout tree the K completions of a node continue the same prompt, and second-turn prompts (which carry the
feedback) are often longer than the completions. Recomputing the prompt for each of the K rows is most of the work of
the update and of the prefill of `generate`. Here each distinct prompt runs once (all but its last token); its keys
and values are then indexed out to the rows that continue it, and the rows run only their last prompt token and their
completion. Gradients flow back through the indexing into the single prompt forward, so the result equals the full
forward up to float rounding (rotary models: position offsets shared by a row cancel out).

Works with any model whose layers keep a plain key/value cache (full attention). The cache layers below never grow
when a layer is recomputed, so activation checkpointing (non-reentrant) gives the same gradients.
"""

from __future__ import annotations

import inspect
from contextlib import contextmanager
from functools import partial

import torch
from torch import nn
from transformers.cache_utils import Cache, DynamicLayer
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.utils import logging

from .batching import length_chunks, prompt_groups


logger = logging.get_logger(__name__)


class _RecordingLayer(DynamicLayer):
    """Keeps the keys and values one layer computes over the distinct prompts; a recompute overwrites them."""

    def update(self, key_states, value_states, *args, **kwargs):
        self.keys, self.values, self.is_initialized = key_states, value_states, True
        self.device = key_states.device
        return key_states, value_states


class _PrefixLayer(DynamicLayer):
    """A fixed prefix: `update` returns prefix + new states and stores nothing, so a recompute sees the same keys."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor):
        super().__init__()
        self.keys, self.values, self.is_initialized, self.device = keys, values, True, keys.device

    def update(self, key_states, value_states, *args, **kwargs):
        return torch.cat([self.keys, key_states], dim=-2), torch.cat([self.values, value_states], dim=-2)


def _grown(buffer: torch.Tensor, size: int) -> torch.Tensor:
    """`buffer` (batch, heads, positions, dim) with room for `size` positions, its content kept."""
    extra = buffer.new_empty(*buffer.shape[:2], size - buffer.size(-2), buffer.size(-1))
    return torch.cat([buffer, extra], dim=-2)


class _GrowingLayer(DynamicLayer):
    """Keys and values in a buffer with room to grow: a decoding step writes its position in place, where
    DynamicLayer copies the whole cache (`torch.cat`) at every step, a fifth of CPU generation time on small models."""

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity, self.length = capacity, 0

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            shape = (*key_states.shape[:2], self.capacity, key_states.size(-1))
            self._keys, self._values = key_states.new_empty(shape), value_states.new_empty(shape)
            self.is_initialized, self.device = True, key_states.device
        end = self.length + key_states.size(-2)
        if end > self._keys.size(-2):  # past the planned capacity (not within `generate`): grow
            size = max(end, 2 * self._keys.size(-2))
            self._keys, self._values = _grown(self._keys, size), _grown(self._values, size)
        self._keys[:, :, self.length : end] = key_states
        self._values[:, :, self.length : end] = value_states
        self._set_length(end)
        return self.keys, self.values

    def _set_length(self, length: int) -> None:
        self.length = length
        self.keys, self.values = self._keys[:, :, :length], self._values[:, :, :length]

    # The row and length operations of a cache act on the buffer, so that later updates stay consistent.
    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.is_initialized:
            self._keys, self._values = self._keys[indices], self._values[indices]
            self._set_length(self.length)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.batch_select_indices(beam_idx.to(self.device))

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.is_initialized:
            self.batch_select_indices(torch.arange(self._keys.size(0), device=self.device).repeat_interleave(repeats))

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError(
                f"_GrowingLayer.crop takes a negative number of tokens to remove, got {tokens_to_remove}."
            )
        if self.is_initialized and tokens_to_remove < 0:
            self._set_length(max(self.length + tokens_to_remove, 0))

    def reset(self) -> None:
        self.length = 0
        super().reset()


def supports_prompt_sharing(model: nn.Module) -> bool:
    """Whether `model` (a causal LM, or a PEFT model around one) is one the shared computation is exact for: rotary
    position embeddings, a `cache` argument, and a plain, full key/value cache in every attention layer (Llama, Qwen2,
    Mistral, ... without sliding windows). Others (e.g. GPT-2's absolute positions and its own cache handling) compute
    plainly."""
    peft_configs = getattr(model, "peft_config", None) or {}
    if any(getattr(c, "is_prompt_learning", False) for c in peft_configs.values()):
        return False  # prompt and prefix tuning put virtual tokens (or their own cache) in front of every forward
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if "cache" not in inspect.signature(type(base).forward).parameters:
        return False  # e.g. remote code written for another transformers version
    if not any(type(m).__name__.endswith("RotaryEmbedding") for m in base.modules()):
        return False
    config = base.config.get_text_config()
    if getattr(config, "is_encoder_decoder", False):
        return False
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        return all(kind == "full_attention" for kind in layer_types)
    return getattr(config, "sliding_window", None) is None


def uses_reentrant_checkpointing(model: nn.Module) -> bool:
    """Whether a layer of `model` is checkpointed reentrantly (layers run without autograd: keys and values shared
    across forwards would carry no gradient). A checkpoint function whose setting is unknown counts as reentrant."""
    for layer in model.modules():
        if isinstance(layer, GradientCheckpointingLayer) and layer.gradient_checkpointing:
            keywords = getattr(getattr(layer, "_gradient_checkpointing_func", None), "keywords", None)
            if keywords is None or keywords.get("use_reentrant") is not False:
                return True
    return False


def prefill_applies(generation_config, model: nn.Module) -> bool:
    """Whether `generate` with this config takes a prefilled cache as is: one sequence per row, the model's own cache.

    Values left unset in `generation_config` are the model's (as `generate` merges them).
    """

    def setting(name):
        value = getattr(generation_config, name, None)
        return value if value is not None else getattr(model.generation_config, name, None)

    return (
        setting("cache_implementation") is None
        and (setting("num_beams") or 1) == 1
        and (setting("num_return_sequences") or 1) == 1
        and setting("use_cache") is not False
        and setting("prompt_lookup_num_tokens") is None
        and setting("assistant_early_exit") is None
    )


@contextmanager
def _cache_through_checkpointing(model: nn.Module):
    """Checkpointed layers drop the cache argument, since a recompute would grow a normal cache a second time. The
    caches above never grow on a recompute, so the layers may keep them (transformers' `_can_checkpoint_with_cache`)."""
    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    for layer in layers:
        layer._can_checkpoint_with_cache = True
    try:
        yield
    finally:
        for layer in layers:
            del layer._can_checkpoint_with_cache


def _prefix_inputs(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, first: torch.Tensor):
    """The distinct prompts without their last column, at least one column wide (a padding column if need be)."""
    ids, mask = prompt_ids[first, :-1], prompt_mask[first, :-1]
    if ids.size(1) == 0:  # every prompt is one token: the prefix is a single masked column
        ids, mask = prompt_ids[first, :1], torch.zeros_like(prompt_mask[first, :1])
    return ids, mask


def shared_prompt_logps(
    model: nn.Module,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs (and entropies) of the completions, each distinct prompt run once.

    `model` is a causal LM patched with TRL's `add_fused_lm_head` (called with `fused_lm_head=True`, as GRPOTrainer
    does), or a module that routes to one. Prompts are left-padded, completions right-padded.

    Returns ``(log_probs, entropy)``, each ``(rows, completion columns)``; ``entropy`` is None when the fused head does
    not compute it.
    """
    first, group = prompt_groups(prompt_ids, prompt_mask)
    prefix_ids, prefix_mask = _prefix_inputs(prompt_ids, prompt_mask, first)
    # The rows run their last prompt token (whose output predicts the first completion token) and their completion,
    # at the positions the full forward gives them (not shifted by a padding column in front of one-token prompts).
    input_ids = torch.cat([prompt_ids[:, -1:], completion_ids], dim=1)
    attention_mask = torch.cat([prefix_mask[group], prompt_mask[:, -1:], completion_mask], dim=1)
    start = prompt_ids.size(1) - 1
    position_ids = torch.arange(start, start + input_ids.size(1), device=input_ids.device).unsqueeze(0)
    labels = input_ids.masked_fill(attention_mask[:, -input_ids.size(1) :] == 0, -100)
    labels[:, 0] = -100
    with _cache_through_checkpointing(model):
        recorded = Cache(layer_class_to_replicate=_RecordingLayer)
        model(input_ids=prefix_ids, attention_mask=prefix_mask, cache=recorded, logits_to_keep=1)
        prefix = Cache(layers=[_PrefixLayer(layer.keys[group], layer.values[group]) for layer in recorded.layers])
        out = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=prefix,
            labels=labels,
            fused_lm_head=True,
        )
    return out.log_probs, out.entropy


@torch.no_grad()
def prefilled_cache(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int
) -> Cache:
    """A `generate` cache for left-padded rows, with each distinct prompt prefilled once (all but its last token).

    Pass it to `model.generate(input_ids=input_ids, attention_mask=attention_mask, cache=cache)`: generation starts
    from the last prompt token, as after a full prefill. The cache has room for `max_new_tokens` more positions.
    """
    cache = Cache(layer_class_to_replicate=partial(_GrowingLayer, input_ids.size(1) + max_new_tokens))
    if input_ids.size(1) < 2:
        return cache  # nothing to prefill before the last token
    first, group = prompt_groups(input_ids, attention_mask)
    prefix_ids, prefix_mask = _prefix_inputs(input_ids, attention_mask, first)
    # The positions `generate` gives a left-padded prompt: counted from its first real token.
    position_ids = (prefix_mask.long().cumsum(-1) - 1).clamp(min=0)
    model(
        input_ids=prefix_ids,
        attention_mask=prefix_mask,
        position_ids=position_ids,
        cache=cache,
        use_cache=True,
        logits_to_keep=1,
    )
    cache.batch_select_indices(group)
    return cache


def prompt_sharing(team, requested: bool) -> bool:
    """`share_prompts` as it applies to this team: every agent must support it (`supports_prompt_sharing`); when one
    does not, every agent uses the plain computation, and that is said once."""
    if not requested:
        return False
    plain = [i for i in range(team.num_agents) if not supports_prompt_sharing(team.agent(i))]
    if plain:
        logger.warning_once(
            f"MAGRPOTrainer: share_prompts=True, but agent(s) {plain} cannot share a prompt's keys and values (it "
            "needs a rotary model with full attention whose forward takes `cache`, as in transformers 5.24, and "
            "no prompt-learning adapter); every agent uses the plain computation. The results are the same, only "
            "slower."
        )
    return not plain


def chunked_per_token_logps(
    model,
    input_ids,
    attention_mask,
    logits_to_keep: int,
    chunk_rows: int,
    shared: bool,
    compute_entropy: bool,
    plain_logps,
    autocast,
):
    """Per-token log-probs (and entropies) of rows sorted by length, in chunks of at most `chunk_rows` trimmed of
    their shared padding; within a chunk, each distinct prompt runs once when `shared` (`shared_prompt_logps`),
    else `plain_logps(model, ids, mask, keep, compute_entropy=...)` (GRPOTrainer's) runs on the chunk. The rows come
    back in their order, padded to `logits_to_keep`.

    Tree rows differ a lot in length (second-turn prompts carry the feedback), so padding every row to the longest
    wastes compute, and the K rows of a node repeat its prompt. Rotary position embeddings make both exact up to float
    rounding.
    """
    prompt_width = input_ids.size(1) - logits_to_keep
    logps, entropies, rows = [], [], []
    for chunk, start, keep in length_chunks(input_ids, attention_mask, logits_to_keep, chunk_rows, shared):
        if shared:
            prompt, completion = slice(start, prompt_width), slice(prompt_width, prompt_width + keep)
            with autocast():
                chunk_logps, chunk_entropies = shared_prompt_logps(
                    model,
                    input_ids[chunk, prompt],
                    attention_mask[chunk, prompt],
                    input_ids[chunk, completion],
                    attention_mask[chunk, completion],
                )
        else:
            columns = slice(start, prompt_width + keep)
            chunk_logps, chunk_entropies, _ = plain_logps(
                model, input_ids[chunk, columns], attention_mask[chunk, columns], keep, compute_entropy=compute_entropy
            )
        logps.append(torch.nn.functional.pad(chunk_logps, (0, logits_to_keep - keep)))
        if compute_entropy:
            entropies.append(torch.nn.functional.pad(chunk_entropies, (0, logits_to_keep - keep)))
        rows.append(chunk)
    inverse = torch.argsort(torch.cat(rows))
    return torch.cat(logps)[inverse], torch.cat(entropies)[inverse] if compute_entropy else None
