"""TRL's vLLM importance-sampling rule as a pure function (`importance.py`), on hand-computed values."""

import math

import pytest
import torch

from trl_multiagent.update.importance import importance_sampling_ratio, sampling_stats, sampling_values


OLD = torch.tensor([[-1.0, -2.0, -0.5], [-1.0, -1.0, -3.0]])
SAMPLED = torch.tensor([[-1.5, -1.0, -0.5], [-1.0, float("nan"), -1.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])  # the last token of row 2 is padding


def test_token_truncate_clamps_each_token():
    ratio = importance_sampling_ratio(OLD, SAMPLED, MASK, "token_truncate", 0.5, 1.5)
    expected = torch.tensor([[1.5, 0.5, 1.0], [1.0, 1.0, 1.0]])  # exp(0.5) and exp(-1) clamped; NaN, padding -> 1
    torch.testing.assert_close(ratio, expected)


def test_token_mask_zeroes_tokens_outside_the_range():
    ratio = importance_sampling_ratio(OLD, SAMPLED, MASK, "token_mask", 0.5, 1.5)
    torch.testing.assert_close(ratio, torch.tensor([[0.0, 0.0, 1.0], [1.0, 1.0, 1.0]]))


def test_sequence_modes_use_the_summed_difference():
    # row 1: 0.5 - 1.0 + 0 = -0.5; row 2: 0 (NaN counts 0, padding is masked)
    truncated = importance_sampling_ratio(OLD, SAMPLED, MASK, "sequence_truncate", 0.0, 3.0)
    torch.testing.assert_close(truncated, torch.tensor([[math.exp(-0.5)], [1.0]]))
    masked = importance_sampling_ratio(OLD, SAMPLED, MASK, "sequence_mask", 0.7, None)
    torch.testing.assert_close(masked, torch.tensor([[0.0], [1.0]]))


def test_stats_cover_real_tokens_only():
    ratio = importance_sampling_ratio(OLD, SAMPLED, MASK, "token_truncate", 0.0, 10.0)
    stats = sampling_stats(*sampling_values(OLD, SAMPLED, MASK, ratio))
    assert stats["sampling_logp_difference/max"] == pytest.approx(1.0)  # |-2 - -1|; padding's 2.0 is not counted
    assert stats["sampling_logp_difference/mean"] == pytest.approx((0.5 + 1.0 + 0.0 + 0.0) / 4)  # NaN left out
    assert stats["importance_sampling_ratio/min"] == pytest.approx(math.exp(-1.0))
    assert stats["importance_sampling_ratio/max"] == pytest.approx(math.exp(0.5))


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="vllm_importance_sampling_mode must be one of"):
        importance_sampling_ratio(OLD, SAMPLED, MASK, "tokens", 0.0, 3.0)
