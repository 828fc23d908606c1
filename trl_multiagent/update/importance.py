"""The vLLM importance-sampling correction of TRL's GRPOTrainer, as a plain function of per-token log-probs.

vLLM samples from its own forward, which differs from the trainer's by kernel rounding (and by dtype, if the engine
ran in another precision). GRPOTrainer weighs each token's loss by `exp(old_logp - sampling_logp)`, truncated or
masked per `vllm_importance_sampling_mode`; TRL computes it inside `_generate_and_score_completions`, which this
package replaces, so the same rule lives here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial

import torch

from .batching import loss_mask


MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


def importance_sampling_ratio(
    old_logps: torch.Tensor,
    sampling_logps: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    clip_min: float | None,
    clip_max: float | None,
) -> torch.Tensor:
    """``(rows, tokens)`` ratios for the token modes, ``(rows, 1)`` for the sequence modes (TRL's shapes).

    >>> old = torch.tensor([[-1.0, -2.0]]); sampled = torch.tensor([[-1.0, -1.0]]); mask = torch.ones(1, 2)
    >>> importance_sampling_ratio(old, sampled, mask, "token_truncate", 0.0, 3.0)
    tensor([[1.0000, 0.3679]])
    >>> importance_sampling_ratio(old, sampled, mask, "sequence_mask", 0.5, 2.0)
    tensor([[0.]])
    """
    if mode not in MODES:
        raise ValueError(f"vllm_importance_sampling_mode must be one of {MODES}, got {mode!r}.")
    # Tokens vLLM could not score (NaN) get ratio 1, as in TRL.
    difference = torch.nan_to_num((old_logps - sampling_logps) * mask, nan=0.0)
    if mode.startswith("sequence"):
        difference = difference.sum(dim=-1, keepdim=True)
    ratio = torch.exp(difference)
    if mode.endswith("truncate"):
        return torch.clamp(ratio, min=clip_min, max=clip_max)
    low = clip_min if clip_min is not None else -math.inf
    high = clip_max if clip_max is not None else math.inf
    return ratio.masked_fill((ratio < low) | (ratio > high), 0.0)


def sampling_values(
    old_logps: torch.Tensor, sampling_logps: torch.Tensor, mask: torch.Tensor, ratio: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The flat values TRL's `sampling/*` metrics reduce, for some rows: ``|old - sampling|`` of the real tokens the
    sampler scored, and the ratios (of the real tokens in the token modes, one per row in the sequence modes). Values
    of several chunks of rows concatenate into those of their union."""
    real = mask.bool()
    delta = (old_logps - sampling_logps).abs()[real]
    ratios = ratio[real] if ratio.shape == mask.shape else ratio.flatten()
    return delta[~torch.isnan(delta)], ratios


def sampling_stats(deltas: torch.Tensor, ratios: torch.Tensor) -> dict[str, float]:
    """How far the sampler was from the trainer: TRL's `sampling/*` metrics for one process's rows, from their
    `sampling_values`.

    Keys (TRL's, without their `sampling/` prefix): `sampling_logp_difference/{mean,max}` and
    `importance_sampling_ratio/{min,mean,max}`; NaN when there is no real token.

    >>> sampling_stats(torch.tensor([0.5, 0.0]), torch.tensor([2.0, 1.0]))["importance_sampling_ratio/mean"]
    1.5
    """
    nan = float("nan")
    return {
        "sampling_logp_difference/mean": deltas.mean().item() if deltas.numel() else nan,
        "sampling_logp_difference/max": deltas.max().item() if deltas.numel() else nan,
        "importance_sampling_ratio/min": ratios.min().item() if ratios.numel() else nan,
        "importance_sampling_ratio/mean": ratios.mean().item() if ratios.numel() else nan,
        "importance_sampling_ratio/max": ratios.max().item() if ratios.numel() else nan,
    }


def reduce_sampling_stats(gathered: list[dict[int, dict[str, float]]]) -> dict[str, float]:
    """TRL's `sampling/*` metrics over every process and corrected agent, and `agent_{i}/sampling/*` for each, from
    each process's `sampling_stats` per agent (``gathered[process][agent]``, the same agents on every process). NaN
    (no real token on a process) is left out.

    >>> reduce_sampling_stats([{1: {"x/max": 1.0}}, {1: {"x/max": 3.0}}])
    {'agent_1/sampling/x/max': 3.0, 'sampling/x/max': 3.0}
    """
    reduce = {"min": min, "max": max, "mean": lambda values: sum(values) / len(values)}
    metrics, agents = {}, list(gathered[0])
    for key in gathered[0][agents[0]]:
        how = reduce[key.rsplit("/", 1)[1]]
        for agent in agents:
            values = [p[agent][key] for p in gathered if not math.isnan(p[agent][key])]  # NaN: no token scored
            if values:
                metrics[f"agent_{agent}/sampling/{key}"] = how(values)
        values = [p[a][key] for p in gathered for a in agents if not math.isnan(p[a][key])]
        if values:
            metrics[f"sampling/{key}"] = how(values)
    return metrics


def add_importance_sampling_ratio(batch: dict, old_logps: torch.Tensor, args) -> tuple[torch.Tensor, torch.Tensor]:
    """Put TRL's `importance_sampling_ratio` into `batch` (some of one agent's rows), from the old policy's log-probs
    and the batch's `sampling_per_token_logps`, with `args`' `vllm_importance_sampling_*` settings; return the rows'
    `sampling_values`."""
    sampled, mask = batch["sampling_per_token_logps"], loss_mask(batch)
    ratio = importance_sampling_ratio(
        old_logps,
        sampled,
        mask,
        args.vllm_importance_sampling_mode,
        args.vllm_importance_sampling_clip_min,
        args.vllm_importance_sampling_clip_max,
    )
    batch["importance_sampling_ratio"] = ratio
    return sampling_values(old_logps, sampled, mask, ratio)


class RatioFromLoss:
    """The correction computed in the loss, from the loss's own log-probs, for rows that are on-policy.

    GRPOTrainer computes the old policy's log-probs in an extra forward over every row before the update, because
    vLLM's correction needs them. When a generation's rows serve exactly one optimizer step (`num_iterations == 1`,
    `gradient_accumulation_steps` a multiple of `steps_per_generation`), the old policy is the policy the loss runs:
    its log-probs, detached, give the same ratio at no extra cost. TRL's `_compute_loss` computes the policy's
    log-probs before it reads `importance_sampling_ratio` (or OPSM's `sampling_per_token_logps`, or VESPO's ratio),
    so the ratio is set into the rows the moment the log-probs exist:

    - `setter(agent, rows)`: for the loss call of rows that carry sampler log-probs and no ratio, what the call hands
      the policy's log-probs to (`loss_call.LossCall`); None for other rows;
    - `flush()` once a generation's rows have all been through the loss: each agent's `sampling_stats` (TRL's
      `sampling/*` metrics, over the same rows as the separate pass would report).
    """

    def __init__(self, args):
        self.args = args
        self._values: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}

    def setter(self, agent: int, rows: dict) -> Callable[[torch.Tensor], None] | None:
        if "importance_sampling_ratio" in rows or "sampling_per_token_logps" not in rows:
            return None
        return partial(self._set, agent, rows)

    def _set(self, agent: int, rows: dict, logps: torch.Tensor) -> None:
        self._values.setdefault(agent, []).append(add_importance_sampling_ratio(rows, logps.detach(), self.args))

    def flush(self) -> dict[int, dict[str, float]]:
        """Each agent observed since the last flush, in order, with its rows' `sampling_stats`."""
        stats = {a: sampling_stats(*map(torch.cat, zip(*self._values[a], strict=True))) for a in sorted(self._values)}
        self._values = {}
        return stats
