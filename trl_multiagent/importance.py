"""The vLLM importance-sampling correction of TRL's GRPOTrainer, as a plain function of per-token log-probs.

vLLM samples from its own forward, which differs from the trainer's by kernel rounding (and by dtype, if the engine
ran in another precision). GRPOTrainer weighs each token's loss by `exp(old_logp - sampling_logp)`, truncated or
masked per `vllm_importance_sampling_mode`; TRL computes it inside `_generate_and_score_completions`, which this
package replaces, so the same rule lives here.
"""

from __future__ import annotations

import math

import torch


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


def sampling_stats(
    old_logps: torch.Tensor, sampling_logps: torch.Tensor, mask: torch.Tensor, ratio: torch.Tensor
) -> dict[str, float]:
    """How far the sampler was from the trainer: TRL's `sampling/*` metrics for one process's rows.

    Keys (TRL's, without their `sampling/` prefix): `sampling_logp_difference/{mean,max}` and
    `importance_sampling_ratio/{min,mean,max}`; NaN when there is no real token.
    """
    real = mask.bool()
    delta = (old_logps - sampling_logps).abs()[real]
    delta = delta[~torch.isnan(delta)]
    ratios = ratio[real] if ratio.shape == mask.shape else ratio.flatten()  # token modes, or one per sequence
    nan = float("nan")
    return {
        "sampling_logp_difference/mean": delta.mean().item() if delta.numel() else nan,
        "sampling_logp_difference/max": delta.max().item() if delta.numel() else nan,
        "importance_sampling_ratio/min": ratios.min().item() if ratios.numel() else nan,
        "importance_sampling_ratio/mean": ratios.mean().item() if ratios.numel() else nan,
        "importance_sampling_ratio/max": ratios.max().item() if ratios.numel() else nan,
    }


def reduce_sampling_stats(gathered: list[list[dict[str, float]]], agents: list[int]) -> dict[str, float]:
    """TRL's `sampling/*` metrics over every process and corrected agent, and `agent_{i}/sampling/*` for each, from
    each process's `sampling_stats` per agent (``gathered[process][slot]``, `agents[slot]` the agent). NaN (no real
    token on a process) is left out.

    >>> reduce_sampling_stats([[{"x/max": 1.0}], [{"x/max": 3.0}]], agents=[1])
    {'agent_1/sampling/x/max': 3.0, 'sampling/x/max': 3.0}
    """
    reduce = {"min": min, "max": max, "mean": lambda values: sum(values) / len(values)}
    metrics = {}
    for key in gathered[0][0]:
        how = reduce[key.rsplit("/", 1)[1]]
        for slot, agent in enumerate(agents):
            values = [p[slot][key] for p in gathered if p[slot][key] == p[slot][key]]
            if values:
                metrics[f"agent_{agent}/sampling/{key}"] = how(values)
        values = [p[s][key] for p in gathered for s in range(len(agents)) if p[s][key] == p[s][key]]
        if values:
            metrics[f"sampling/{key}"] = how(values)
    return metrics


def add_importance_sampling_ratio(batch: dict, args) -> dict[str, float]:
    """Put TRL's `importance_sampling_ratio` into `batch` (one agent's rows), from its old-policy and sampler
    log-probs (the latter are taken out), with `args`' `vllm_importance_sampling_*` settings; return the sampling
    statistics of TRL's `sampling/*` metrics."""
    old, sampled, mask = batch["old_per_token_logps"], batch.pop("sampling_per_token_logps"), batch["completion_mask"]
    ratio = importance_sampling_ratio(
        old,
        sampled,
        mask,
        args.vllm_importance_sampling_mode,
        args.vllm_importance_sampling_clip_min,
        args.vllm_importance_sampling_clip_max,
    )
    batch["importance_sampling_ratio"] = ratio
    return sampling_stats(old, sampled, mask, ratio)
