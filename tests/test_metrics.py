"""Rollout metrics from hand-made per-process summaries, as the trainer gathers them."""

import pytest

from trl_multiagent.metrics import RolloutStats, rollout_metrics


def test_metrics_over_two_processes_by_hand():
    rank0 = RolloutStats(
        actions=[(1, 0.2, 1.0), (1, 0.4, 1.2), (2, 0.8, 0.8)],
        nodes=[(1, False), (2, True)],
        zero_std_groups=[False, True],
        completion_lengths=[[4, 8], [8, 8]],
        reward_values={1: [[0.2, 0.4]], 2: [[0.8]]},
    )
    rank1 = RolloutStats(
        actions=[(1, 1.0, 1.0)], nodes=[(1, True)], zero_std_groups=[False],
        completion_lengths=[[2], [6]], reward_values={1: [[1.0]], 2: [[]]},
    )  # fmt: skip
    m = rollout_metrics([rank0, rank1], num_turns=2, reward_names=["r"], max_completion_length=8)
    assert m["reward"] == pytest.approx((0.2 + 0.4 + 0.8 + 1.0) / 4)
    assert m["turn_1/reward_mean"] == pytest.approx((0.2 + 0.4 + 1.0) / 3)
    assert m["turn_1/reward_std"] == pytest.approx(0.41633, rel=1e-4)  # sample std of 0.2, 0.4, 1.0
    assert m["turn_1/expected_return"] == pytest.approx((1.0 + 1.2 + 1.0) / 3)
    assert m["turn_1/terminated_frac"] == pytest.approx(0.5)
    assert m["turn_2/reward_mean"] == pytest.approx(0.8) and m["turn_2/reward_std"] == 0.0
    assert m["turn_2/terminated_frac"] == 1.0
    assert m["turn_1/rewards/r/mean"] == pytest.approx((0.2 + 0.4 + 1.0) / 3)
    assert m["frac_reward_zero_std"] == pytest.approx(1 / 3)
    assert m["agent_0/completions/mean_length"] == pytest.approx(14 / 3)
    assert m["agent_1/completions/mean_length"] == pytest.approx(22 / 3)
    assert m["completions/min_length"] == 2 and m["completions/max_length"] == 8
    assert m["completions/clipped_ratio"] == pytest.approx(3 / 6)
    # TRL's keys beside ours: each reward function over every turn, and the lengths of the completions that ended
    assert m["rewards/r/mean"] == pytest.approx(0.6) and m["rewards/r/std"] == pytest.approx(
        0.36515, rel=1e-4
    )  # sample std
    assert m["completions/mean_terminated_length"] == pytest.approx(4.0)
    assert (m["completions/min_terminated_length"], m["completions/max_terminated_length"]) == (2.0, 6.0)
