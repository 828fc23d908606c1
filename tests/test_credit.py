"""Returns, cross-mode credit and advantages on hand-built trees, checked against values computed by hand."""

import math

import pytest
import torch

from trl_multiagent.credit import returns as credit
from trl_multiagent.credit.returns import completion_returns, group_advantages, joint_choices, joint_returns
from trl_multiagent.rollout import Generation, run_rollout


def test_joint_choices_aligned_and_cross():
    assert joint_choices(3, 2, "aligned") == [(0, 0, 0), (1, 1, 1)]
    assert len(joint_choices(2, 4, "cross")) == 16
    assert len(joint_choices(3, 2, "cross")) == 8
    with pytest.raises(ValueError, match="joint_mode"):
        joint_choices(2, 2, "diagonal")


def test_joint_returns_two_turn_tree_by_hand():
    # Root joint actions 0 and 1. Action 0 expanded into a node with actions 2, 3; action 1 ended.
    # Action 2 expanded into a third-turn node with actions 4, 5.
    rewards = [0.5, 0.2, 1.0, 0.0, 0.3, 0.7]
    children = [[2, 3], [], [4, 5], [], [], []]
    g = 0.9
    r4, r5 = 0.3, 0.7
    r2 = 1.0 + g * (r4 + r5) / 2
    r3 = 0.0
    r0 = 0.5 + g * (r2 + r3) / 2
    expected = [r0, 0.2, r2, r3, r4, r5]
    assert joint_returns(rewards, children, discount=g) == pytest.approx(expected)
    # discount 0: returns are the rewards
    assert joint_returns(rewards, children, discount=0.0) == pytest.approx(rewards)


def test_joint_returns_rejects_bad_order():
    with pytest.raises(ValueError, match="child id"):
        joint_returns([1.0, 2.0], [[], [0]])


def test_cross_mode_completion_credit_by_hand():
    # 2 agents, K=2: joint actions (a_i, b_j) with returns R[i][j]
    choices = [(0, 0), (0, 1), (1, 0), (1, 1)]
    returns = [1.0, 2.0, 4.0, 8.0]
    credited = completion_returns(choices, returns, num_agents=2, num_generations=2)
    # agent 0 completion 0 is in (0,0),(0,1): mean(1,2)=1.5 ; completion 1: mean(4,8)=6
    # agent 1 completion 0 is in (0,0),(1,0): mean(1,4)=2.5 ; completion 1: mean(2,8)=5
    assert credited.tolist() == [[1.5, 6.0], [2.5, 5.0]]


def test_aligned_mode_credit_is_the_joint_return():
    choices = joint_choices(3, 3, "aligned")
    credited = completion_returns(choices, [0.1, 0.2, 0.3], 3, 3)
    assert torch.allclose(credited, torch.tensor([[0.1, 0.2, 0.3]] * 3))


def test_group_advantages_modes_by_hand():
    returns = torch.tensor([[1.0, 2.0, 3.0, 6.0], [0.0, 0.0, 1.0, 1.0]])
    centred = torch.tensor([[-2.0, -1.0, 0.0, 3.0], [-0.5, -0.5, 0.5, 0.5]])
    std0 = math.sqrt((4 + 1 + 0 + 9) / 3)  # Bessel-corrected
    std1 = math.sqrt(4 * 0.25 / 3)
    group = group_advantages(returns, "group")
    assert torch.allclose(group[0], centred[0] / (std0 + 1e-4))
    assert torch.allclose(group[1], centred[1] / (std1 + 1e-4))
    batch_std = returns.flatten().std().item()
    assert torch.allclose(group_advantages(returns, "batch"), centred / (batch_std + 1e-4))
    assert torch.allclose(group_advantages(returns, "none"), centred)
    # A group where every completion has the same return gets zero advantage
    assert group_advantages(torch.ones(1, 4), "group").abs().max() == 0


def test_advantage_baselines_by_hand():
    """CoMLRL's advantage modes: mean, rloo (mean of the others), max, raw ("none")."""
    returns = torch.tensor([[1.0, 2.0, 3.0, 6.0]])
    others_mean = torch.tensor([[11 / 3, 10 / 3, 3.0, 2.0]])
    torch.testing.assert_close(group_advantages(returns, "none", "rloo"), returns - others_mean)
    torch.testing.assert_close(group_advantages(returns, "none", "max"), returns - 6.0)
    torch.testing.assert_close(group_advantages(returns, "none", "none"), returns)
    std = returns.std()
    torch.testing.assert_close(group_advantages(returns, "group", "max"), (returns - 6.0) / (std + 1e-4))
    # one completion: no "others", so RLOO falls back to the mean (zero advantage), as CoMLRL does
    assert group_advantages(torch.ones(1, 1) * 5, "none", "rloo").item() == 0
    with pytest.raises(ValueError, match="advantage_baseline must be one of .* got 'median'"):
        group_advantages(returns, "none", "median")


# ---------------------------------------------------------------- rollout trees with fake agents


def fake_generate(agent, prompts, k):
    """Completion k of agent i for prompt p is the text 'a{i}-k{k}|{p}'."""
    return Generation(
        prompt_ids=[[len(p)] for p in prompts],
        completion_ids=[[agent, j] for _ in prompts for j in range(k)],
        completions=[f"a{agent}-k{j}|{p}" for p in prompts for j in range(k)],
    )


def grow(rows, *, num_agents=2, k=4, turns=2, mode="aligned", threshold=None, reward=None):
    calls = []

    def score(turn, tree, actions):
        values = [reward(turn, tree, a) if reward else 1.0 for a in actions]
        calls.append((turn, len(actions)))
        return values

    def transition(turn, tree, actions):
        return [[f"t{turn + 1}:{'/'.join(tree.answers(a))}"] * num_agents for a in actions]

    tree = run_rollout(
        rows,
        num_agents=num_agents,
        num_generations=k,
        num_turns=turns,
        joint_mode=mode,
        termination_threshold=threshold,
        agent_prompts=lambda row: [row["prompt"]] * num_agents,
        generate=lambda agent, prompts, environments, samples: fake_generate(agent, prompts, samples),
        score=score,
        transition=transition,
    )
    return tree, calls


def per_prompt_counts(tree, num_rows, turn):
    counts = [0] * num_rows
    for action in tree.joint_actions:
        node = tree.nodes[action.node]
        if node.turn == turn:
            counts[node.row] += 1
    return counts


def test_tree_size_k4_two_turns_no_termination():
    tree, calls = grow([{"prompt": "p0"}, {"prompt": "p1"}], k=4, turns=2, threshold=None)
    assert per_prompt_counts(tree, 2, 1) == [4, 4]
    assert per_prompt_counts(tree, 2, 2) == [16, 16]
    # one reward call per turn covering every joint answer of every prompt
    assert calls == [(1, 8), (2, 32)]


def test_default_threshold_ends_every_branch_for_nonnegative_reward():
    tree, calls = grow([{"prompt": "p0"}, {"prompt": "p1"}], k=4, turns=2, threshold=-0.2)
    assert per_prompt_counts(tree, 2, 1) == [4, 4]
    assert per_prompt_counts(tree, 2, 2) == [0, 0]
    assert calls == [(1, 8)]
    assert all(node.terminated for node in tree.nodes)


def test_cross_mode_two_agents_k2():
    tree, _ = grow([{"prompt": "p0"}], k=2, turns=2, mode="cross", threshold=None)
    assert per_prompt_counts(tree, 1, 1) == [4]
    assert per_prompt_counts(tree, 1, 2) == [16]


def test_threshold_expands_only_nodes_below_it():
    # Prompt "good" scores 1.0 on turn 1 (mean above 0.5: ends); "bad" scores 0.0 (expanded)
    def reward(turn, tree, a):
        return 1.0 if tree.nodes[tree.joint_actions[a].node].prompts[0] == "good" else 0.0

    tree, _ = grow([{"prompt": "good"}, {"prompt": "bad"}], k=2, turns=2, threshold=0.5, reward=reward)
    assert per_prompt_counts(tree, 2, 2) == [0, 4]


def test_rollout_returns_and_history_by_hand():
    # K=2, 2 agents, 2 turns, aligned. Turn-1 rewards 0.0 / 1.0 by completion index; turn-2 rewards
    # 10 + index. Return of turn-1 joint action j = r_j + mean(10, 11) = r_j + 10.5
    def reward(turn, tree, a):
        k = tree.joint_actions[a].choice[0]
        return float(k) if turn == 1 else 10.0 + k

    tree, _ = grow([{"prompt": "p"}], k=2, turns=2, threshold=None, reward=reward)
    returns = credit.tree_returns(tree, discount=1.0)
    by_turn = {}
    for a, action in enumerate(tree.joint_actions):
        by_turn.setdefault(tree.nodes[action.node].turn, []).append(returns[a])
    assert by_turn[1] == pytest.approx([10.5, 11.5])
    assert by_turn[2] == pytest.approx([10.0, 11.0, 10.0, 11.0])
    # history along a turn-2 joint action: both prompts and both answers per agent
    last = len(tree.joint_actions) - 1
    prompts, responses = tree.history(last)
    assert prompts[0][0] == "p" and prompts[0][1].startswith("t2:")
    assert responses[1] == ["a1-k1|p", f"a1-k1|{prompts[1][1]}"]
    # advantages of the root group, scale none: returns minus their mean
    credited = credit.credited_returns(tree, [returns, returns])[0]
    assert group_advantages(credited, "none").tolist() == [[-0.5, 0.5], [-0.5, 0.5]]
