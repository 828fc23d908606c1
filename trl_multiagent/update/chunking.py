"""The update in chunks: a micro-batch's rows cut into chunks of at most `update_chunk_size` rows per agent, each with
a weight that makes the chunks' losses add up to the micro-batch's loss. Plain tensor functions, no model.

A tree's rows grow with K and the number of turns; a chunk does not. Each chunk runs its own forward and backward, so
the update's peak memory is one chunk's, and the gradients accumulate over the chunks inside the optimizer step.

TRL's loss types normalise differently, so the weight of a chunk depends on the loss type:

- ``grpo``, ``sapo``, ``luspo`` and ``dr_grpo`` divide by the rows of the call (a mean over rows, or rows times
  `max_completion_length`): a chunk weighs its rows over the micro-batch's *real* rows. Inert rows (see
  `batching.pad_rows`) count in the chunk's own division, and not in the micro-batch's, so they dilute nothing.
- ``bnpo`` divides by the completion tokens of the call: a chunk weighs its tokens over the micro-batch's.
- ``dapo``, ``cispo`` and ``vespo`` divide by `num_items_in_batch`, the tokens of the whole generation batch: weight 1.
"""

from __future__ import annotations

import torch

from .batching import length_chunks, loss_mask, take_rows, trim


ROW_NORMALISED_LOSSES = ("grpo", "sapo", "luspo", "dr_grpo")
TOKEN_NORMALISED_LOSSES = ("bnpo",)
BATCH_NORMALISED_LOSSES = ("dapo", "cispo", "vespo")
LOSS_TYPES = ROW_NORMALISED_LOSSES + TOKEN_NORMALISED_LOSSES + BATCH_NORMALISED_LOSSES


def check_loss_type(loss_type: str) -> None:
    """The config's rule (`MAGRPOConfig`): a loss type whose normalisation `chunk_weight` knows."""
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"MAGRPOConfig: loss_type={loss_type!r} is not one of {list(LOSS_TYPES)}.")


def chunk_weight(loss_type: str, chunk: dict, whole: dict) -> float:
    """The factor that turns TRL's loss on `chunk` into its share of TRL's loss on `whole` (real rows only).

    >>> whole = {"completion_mask": torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]]), "is_real": torch.tensor([1, 1, 0])}
    >>> chunk = {key: value[1:] for key, value in whole.items()}  # one real row, one inert row
    >>> chunk_weight("grpo", chunk, whole), chunk_weight("bnpo", chunk, whole), chunk_weight("dapo", chunk, whole)
    (1.0, 0.3333333333333333, 1.0)

    `loss_type` is one of `LOSS_TYPES`: the config refused any other (`check_loss_type`).
    """
    if loss_type in BATCH_NORMALISED_LOSSES:
        return 1.0
    if loss_type in TOKEN_NORMALISED_LOSSES:
        # TRL clamps the token count at 1; a chunk without tokens has a zero loss whatever its weight
        return max(int(loss_mask(chunk).sum()), 1) / max(int(loss_mask(whole).sum()), 1)
    return chunk["completion_mask"].size(0) / max(int(whole["is_real"].sum()), 1)


def update_chunks(
    agent_batches: list[dict], chunk_rows: int, loss_type: str, group_prompts: bool = True
) -> list[tuple[list[dict], list[float]]]:
    """Cut each agent's rows of one micro-batch into chunks of at most `chunk_rows` rows.

    Rows are ordered as `batching.length_chunks` orders them (by length; with `group_prompts`, the K rows that
    continue one prompt side by side, so a chunk runs that prompt once), and each chunk is trimmed of the padding its
    rows share. The number of chunks depends on the row counts alone, so processes with equal counts run the same
    forwards.

    Returns:
        ``[(per-agent chunk dicts, per-agent weights), ...]``, one entry per chunk. Each chunk dict also holds its
        weight (`loss_weight`) and its share of its agent's loss tokens (`token_share`), for `update.entropy`.
    """
    if chunk_rows < 1:
        raise ValueError(f"update_chunks: chunk_rows must be >= 1, got {chunk_rows}.")
    counts = [batch["prompt_ids"].size(0) for batch in agent_batches]
    if len(set(counts)) > 1:
        raise ValueError(f"update_chunks: every agent must have the same number of rows (K per node), got {counts}.")
    per_agent = []
    for batch in agent_batches:
        input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
        attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        cuts = length_chunks(input_ids, attention_mask, batch["completion_ids"].size(1), chunk_rows, group_prompts)
        chunks = [trim(take_rows(batch, rows)) for rows, _, _ in cuts]
        tokens = max(int(loss_mask(batch).sum()), 1)
        for chunk in chunks:  # for the entropy bonus and TRL's `policy_loss` (`entropy`)
            chunk["loss_weight"] = chunk_weight(loss_type, chunk, batch)
            chunk["token_share"] = int(loss_mask(chunk).sum()) / tokens
        per_agent.append([(chunk, chunk["loss_weight"]) for chunk in chunks])
    return [tuple(map(list, zip(*chunk, strict=True))) for chunk in zip(*per_agent, strict=True)]
