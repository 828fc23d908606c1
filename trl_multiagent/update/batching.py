"""Flat training rows per agent, and their split into micro-batches. Plain tensor functions, no model.

One agent's rows are a dict of tensors with a leading row dimension (``prompt_ids``, ``prompt_mask``,
``completion_ids``, ``completion_mask``, ``advantages``, ``is_real`` and optional per-token log-probs) plus the scalar
``num_items_in_batch``: the shape TRL's `_compute_loss` takes. Agents keep separate dicts because their vocabularies,
pad tokens and lengths differ.
"""

from __future__ import annotations

import torch
from torch.utils.data import Sampler
from trl.trainer.utils import pad


# Keys whose second dimension runs over completion tokens.
COMPLETION_KEYS = (
    "completion_ids",
    "completion_mask",
    "old_per_token_logps",
    "ref_per_token_logps",
    "importance_sampling_ratio",
    "sampling_per_token_logps",
    "tool_mask",
)


def loss_mask(batch: dict) -> torch.Tensor:
    """The tokens the loss counts, as TRL's `_compute_loss` masks them: ``completion_mask * tool_mask`` (tool results
    are not the model's tokens), or ``completion_mask`` without tools."""
    mask = batch["completion_mask"]
    return mask * batch["tool_mask"] if "tool_mask" in batch else mask


def agent_rows(
    prompt_ids: list[list[int]],
    completion_ids: list[list[int]],
    advantages: torch.Tensor,
    pad_token_id: int,
    device: torch.device | str = "cpu",
) -> dict[str, torch.Tensor]:
    """Pad one agent's rows: prompts on the left, completions on the right (as GRPOTrainer does)."""
    prompts = [torch.tensor(ids, dtype=torch.long) for ids in prompt_ids]
    completions = [torch.tensor(ids, dtype=torch.long) for ids in completion_ids]
    return {
        "prompt_ids": pad(prompts, padding_value=pad_token_id, padding_side="left").to(device),
        "prompt_mask": pad([torch.ones_like(p) for p in prompts], padding_value=0, padding_side="left").to(device),
        "completion_ids": pad(completions, padding_value=pad_token_id, padding_side="right").to(device),
        "completion_mask": pad([torch.ones_like(c) for c in completions], padding_value=0, padding_side="right").to(
            device
        ),
        "advantages": advantages.to(device),
        "is_real": torch.ones(len(prompts), dtype=torch.bool, device=device),  # False for the inert rows of `pad_rows`
    }


def tree_rows(
    tree,
    agent: int,
    advantages: torch.Tensor,
    pad_token_id: int,
    eos_token_ids: list[int] | None,
    sampling_logps: bool = False,
    device: torch.device | str = "cpu",
) -> dict[str, torch.Tensor]:
    """One agent's rows of a rollout tree (`rollout.RolloutTree`): each completion's prompt and completion, node-major,
    with `advantages` of shape ``(nodes, agents, K)``. With `eos_token_ids` (TRL's `mask_truncated_completions`), a
    completion that does not end with one of them has its mask zeroed. With `sampling_logps`, the sampler's per-token
    log-probs in the tree (vLLM's) are added as ``sampling_per_token_logps``, for the importance-sampling correction.
    When the agents called tools, TRL's ``tool_mask`` (0 on tool results) comes along, padded with 1 as TRL pads it.

    The tree comes in as data: only its `nodes` (each one's prompt and completion ids, sampler log-probs and tool masks)
    are read. `update` sits below `rollout`, so it imports nothing of it."""
    prompt_ids = [ids for node in tree.nodes for ids in node.prompt_ids[agent]]
    completion_ids = [ids for node in tree.nodes for ids in node.completion_ids[agent]]
    batch = agent_rows(prompt_ids, completion_ids, advantages[:, agent].flatten(), pad_token_id, device)
    if eos_token_ids is not None:
        ends_with_eos = torch.tensor([ids[-1] in eos_token_ids for ids in completion_ids], device=device)
        batch["completion_mask"] *= ends_with_eos[:, None]
    if sampling_logps:
        logps = [torch.tensor(lp) for node in tree.nodes for lp in node.sampling_logps[agent]]
        batch["sampling_per_token_logps"] = pad(logps, padding_value=0.0, padding_side="right").to(device)
    if any(node.tool_masks for node in tree.nodes):
        masks = [torch.tensor(m, dtype=torch.long) for node in tree.nodes for m in node.tool_masks[agent]]
        batch["tool_mask"] = pad(masks, padding_value=1, padding_side="right").to(device)
    return batch


def _rows(batch: dict) -> int:
    return batch["prompt_ids"].size(0)


# The keys the update adds to an agent's rows after `tree_rows` (the log-prob passes, the importance-sampling ratio,
# the loss's token count, the chunks' weights): a column of `add_row_columns` may not take one of them
UPDATE_KEYS = frozenset(
    {"num_items_in_batch", "old_per_token_logps", "ref_per_token_logps", "importance_sampling_ratio", "loss_weight",
     "token_share"}
)  # fmt: skip


def add_row_columns(batch: dict, columns: dict[str, torch.Tensor], agent: int, advantages: torch.Tensor) -> None:
    """Add per-completion `columns` (each a ``(nodes, agents, K)`` table, as `advantages`) to `agent`'s rows of
    `tree_rows`, in the same order: values an advantage estimator hands the loss along with each row. A column that
    would replace one of the rows' own keys, or that is not shaped as the advantages, is refused.

    >>> batch = {"advantages": torch.zeros(2)}
    >>> add_row_columns(batch, {"target": torch.tensor([[[1.0], [2.0]], [[3.0], [4.0]]])}, 1, torch.zeros(2, 2, 1))
    >>> batch["target"]
    tensor([2., 4.])
    """
    for key, table in columns.items():
        if key in batch or key in UPDATE_KEYS:
            raise ValueError(f"add_row_columns: a column named {key!r} would replace the rows' own {key!r}.")
        if tuple(table.shape) != tuple(advantages.shape):
            raise ValueError(
                f"add_row_columns: column {key!r} has shape {tuple(table.shape)}; the advantages' is "
                f"{tuple(advantages.shape)} (nodes, agents, K)."
            )
        batch[key] = table[:, agent].flatten().to(batch["advantages"].device)


def take_rows(batch: dict, rows: torch.Tensor | slice) -> dict:
    """The given rows of every per-row tensor; scalars (``num_items_in_batch``) as they are."""
    return {k: v[rows] if isinstance(v, torch.Tensor) and v.dim() > 0 else v for k, v in batch.items()}


def row_tokens(batch: dict) -> int:
    """Prompt and completion tokens of a batch's rows (padding and inert rows not counted)."""
    return int(batch["prompt_mask"].sum() + batch["completion_mask"].sum())


def pad_rows(batch: dict, num_rows: int) -> dict:
    """Append inert rows until the batch has `num_rows` rows.

    An inert row copies the first row's tokens (so the forward sees real text and stays finite) with a zero completion
    mask, a zero advantage and `is_real` False: it adds nothing to the loss or its gradient, and the update's chunk
    weights do not count it (`chunking.chunk_weight`). It exists so that every micro-batch, and every process, runs the
    same forwards.
    """
    missing = num_rows - _rows(batch)
    if missing < 0:
        raise ValueError(f"pad_rows: batch already has {_rows(batch)} rows, more than {num_rows}.")
    if missing == 0:
        return batch
    out = {}
    for key, value in batch.items():
        if not isinstance(value, torch.Tensor) or value.dim() == 0:
            out[key] = value
            continue
        filler = value[:1].expand(missing, *value.shape[1:]).clone()
        if key in ("completion_mask", "advantages", "is_real"):
            filler.zero_()
        out[key] = torch.cat([value, filler])
    return out


def trim(batch: dict) -> dict:
    """Drop prompt columns that are padding in every row, and completion columns past the last real token."""
    prompt_keep = batch["prompt_mask"].any(dim=0).nonzero()
    start = int(prompt_keep[0]) if len(prompt_keep) else batch["prompt_mask"].size(1) - 1
    completion_keep = batch["completion_mask"].any(dim=0).nonzero()
    # Keep at least one completion column: TRL slices logits with `-logits_to_keep`, which must not be 0.
    end = int(completion_keep[-1]) + 1 if len(completion_keep) else 1
    out = dict(batch)
    out["prompt_ids"] = batch["prompt_ids"][:, start:]
    out["prompt_mask"] = batch["prompt_mask"][:, start:]
    for key in COMPLETION_KEYS:
        if key in batch and batch[key] is not None:
            out[key] = batch[key][:, :end]
    return out


def split_micro_batches(agent_batches: list[dict], num_chunks: int, generator=None) -> list[list[dict]]:
    """Shuffle each agent's rows and cut them into `num_chunks` micro-batches.

    Every micro-batch gets rows of every agent, the same number per agent in every micro-batch (inert rows pad the
    rest, see `pad_rows`).

    Returns:
        ``micro_batches[s][agent]``: a trimmed row dict.
    """
    micro_batches = [[] for _ in range(num_chunks)]
    for batch in agent_batches:
        n = _rows(batch)
        order = torch.randperm(n, generator=generator)
        shuffled = take_rows(batch, order)
        target = -(-n // num_chunks) * num_chunks
        padded = pad_rows(shuffled, target)
        size = target // num_chunks
        for s in range(num_chunks):
            chunk = take_rows(padded, slice(s * size, (s + 1) * size))
            micro_batches[s].append(trim(chunk))
    return micro_batches


def prompt_groups(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Distinct prompts of left-padded rows.

    Returns ``(first, group)``: the first row holding each distinct prompt, and each row's index into ``first``.
    """
    keys = prompt_ids.masked_fill(prompt_mask == 0, -1)
    _, group = torch.unique(keys, dim=0, return_inverse=True)
    rows = torch.arange(len(group), device=group.device)
    first = torch.full((int(group.max()) + 1,), len(group), device=group.device)
    return first.scatter_reduce(0, group, rows, reduce="amin"), group


def length_chunks(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    logits_to_keep: int,
    chunk_rows: int,
    group_prompts: bool = True,
) -> list[tuple[torch.Tensor, int, int]]:
    """Rows sorted by length and cut into chunks of `chunk_rows`, each with the padding its rows share removed.

    With `group_prompts`, rows are ordered by prompt length, then prompt (rows that continue the same prompt sit
    together, so a chunk can run that prompt once), then completion length; without, by total length; rows without
    a completion token come last.
    `input_ids` and `attention_mask` are ``(rows, prompt + completion)``, prompts left-padded and completions
    right-padded. Returns, per chunk, ``(row indices, first column to keep, completion columns to keep)``. The number
    of chunks depends on the row count alone, so processes with equal row counts run the same number of forwards (as
    ZeRO-3 requires).
    """
    prompt_width = attention_mask.size(1) - logits_to_keep
    prompt_mask = attention_mask[:, :prompt_width]
    prompt_start = prompt_mask.int().argmax(dim=1)  # first real prompt token (left padding)
    prompt_start[prompt_mask.sum(1) == 0] = prompt_width
    completion_len = attention_mask[:, prompt_width:].sum(dim=1)
    prompt_len = prompt_width - prompt_start
    if group_prompts:
        _, group = prompt_groups(input_ids[:, :prompt_width], prompt_mask)
        order = torch.argsort(completion_len, stable=True)
        for key in (group, prompt_len):  # least significant key first
            order = order[torch.argsort(key[order], stable=True)]
    else:
        order = torch.argsort(prompt_len + completion_len, stable=True)
    # Rows without a completion token (the inert rows of `pad_rows`, which copy the first row's prompt) go last, so
    # that they do not break up a prompt's group: with `chunk_rows` a multiple of K, a prompt's K rows share a chunk.
    order = order[torch.argsort((completion_len[order] == 0).int(), stable=True)]
    chunks = []
    for begin in range(0, len(order), chunk_rows):
        rows = order[begin : begin + chunk_rows]
        keep = max(int(completion_len[rows].max()), 1)  # TRL slices with -logits_to_keep, which must not be 0
        chunks.append((rows, int(prompt_start[rows].min()), keep))
    return chunks


class EpochSeededSampler(Sampler):
    """TRL's `RepeatSampler`, with each epoch's order drawn from `seed + epoch`.

    `RepeatSampler` seeds its generator once and advances it every epoch, so a run resumed at epoch e (a fresh
    generator) would see epoch 0's order again. The Trainer calls `set_epoch` before each epoch, resumed or not, so
    here every epoch's order depends on the epoch alone.
    """

    def __init__(self, sampler):
        self.sampler = sampler
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self):
        if self.sampler.shuffle and self.sampler.seed is not None:
            self.sampler.generator.manual_seed(self.sampler.seed + self.epoch)
        return iter(self.sampler)
