"""trl_multiagent.demo.summary: the first-vs-last-quarter statistic the recipe prints, on hand-computed series."""

import math

import pytest

from trl_multiagent.demo.summary import MIN_STEPS, quarter_change, smooth, summary_lines


def test_quarter_change_by_hand():
    # 12 values: quarters of 3. First [0.2, 0.4, 0.3] mean 0.3, sample var 0.01; last [0.6, 0.8, 0.7] mean 0.7, var 0.01.
    values = [0.2, 0.4, 0.3, 0.5, 0.1, 0.9, 0.4, 0.6, 0.5, 0.6, 0.8, 0.7]
    change = quarter_change(values)
    assert change.per_quarter == 3 and change.steps == 12
    assert change.first == pytest.approx(0.3) and change.last == pytest.approx(0.7)
    assert change.first_se == pytest.approx(math.sqrt(0.01 / 3))
    assert change.se == pytest.approx(math.sqrt(2 * 0.01 / 3))  # 0.0816: the change 0.4 is ~4.9 SE
    assert change.change == pytest.approx(0.4) and change.verdict == "improved"


def test_verdicts_follow_twice_the_standard_error():
    noisy_flat = [0.5, 0.3, 0.5, 0.3, 0.4, 0.4, 0.4, 0.4, 0.3, 0.5, 0.3, 0.5]
    assert quarter_change(noisy_flat).verdict == "no clear change"
    assert quarter_change(list(reversed([0.2, 0.4, 0.3, 0.5, 0.1, 0.9, 0.4, 0.6, 0.5, 0.6, 0.8, 0.7]))).verdict == (
        "declined"
    )
    # a change of exactly 1.5 SE is not an improvement: first [0, s], last [d, d + s]
    se_quarter = math.sqrt(0.5 * 0.1**2 / 2)  # sample std of two values 0.1 apart, over sqrt(2)
    d = 1.5 * math.sqrt(2) * se_quarter
    assert quarter_change([0.0, 0.1, 9, 9, 9, 9, d, d + 0.1]).verdict == "no clear change"
    d = 2.5 * math.sqrt(2) * se_quarter
    assert quarter_change([0.0, 0.1, 9, 9, 9, 9, d, d + 0.1]).verdict == "improved"


def test_too_few_steps_have_no_standard_error():
    change = quarter_change([0.1] * (MIN_STEPS - 1))
    assert math.isnan(change.se) and change.verdict == "too few steps to tell"


def test_smooth_is_a_centred_moving_average_that_skips_nans():
    assert smooth([1.0, 2.0, 3.0, 4.0], 3) == pytest.approx([1.5, 2.0, 3.0, 3.5])
    assert smooth([1.0, float("nan"), 3.0], 3) == pytest.approx([1.0, 2.0, 3.0])


def test_summary_lines_name_each_turn_and_agent():
    history = [{"step": s + 1, "turn_1/reward_mean": 0.1 * s, "turn_2/reward_mean": 0.5,
                "agent_0/completions/mean_length": 20 - s, "agent_1/completions/mean_length": 10.0}
               for s in range(8)]  # fmt: skip
    history.append({"train_runtime": 1.0})  # the Trainer's last entry has no reward
    lines = summary_lines(history)
    assert lines[0].startswith("Summary over 8 logged steps: mean of the first 2 -> the last 2")
    assert lines[1] == "  turn 1 reward  0.050 ± 0.050 -> 0.650 ± 0.050, change +0.600 ± 0.071: improved"
    assert lines[2] == "  turn 2 reward  0.500 ± 0.000 -> 0.500 ± 0.000, change +0.000 ± 0.000: no clear change"
    assert lines[3] == "  agent 0 mean completion length  19.5 -> 13.5 tokens"
    one = summary_lines([{"step": 1, "turn_1/reward_mean": 0.5}])
    assert one[0].startswith("Summary over 1 logged step: ")
    assert one[1] == f"  turn 1 reward  0.500 -> 0.500: too few steps to tell (1 step; needs {MIN_STEPS})"
    assert summary_lines([{"loss": 1.0}])[0].startswith("Summary: no turn_{t}/reward_mean was logged")
