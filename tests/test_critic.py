"""The critic's parts (`trl_multiagent.critic`): TD targets and advantages on hand-worked two-turn trees, CoMLRL's
clipped value loss on fixed numbers, and where a value head's gradient goes."""

import pytest
import torch

from trl_multiagent.critic import ValueHead, last_hidden, td_targets, tree_td, value_loss
from trl_multiagent.demo.testing import make_model, make_tokenizer
from trl_multiagent.rollout.tree import JointAction, Node, RolloutTree


def two_turn_tree(rewards, terminated_row=True) -> RolloutTree:
    """Two rows, K=2 aligned, two agents. Row 0's root (node 0: joint actions 0, 1) goes on: joint action 0 into
    node 2 (joint actions 4, 5), 1 into node 3 (6, 7). Row 1's root (node 1: joint actions 2, 3) ended early."""
    tree = RolloutTree()
    parents = [None, None, 0, 1]
    for n, parent in enumerate(parents):
        node = Node(row=n % 2 if parent is None else 0, turn=1 if parent is None else 2, prompts=[], parent=parent)
        node.terminated = n == 1 and terminated_row
        node.joint_actions = [2 * n, 2 * n + 1]
        tree.nodes.append(node)
    for a, reward in enumerate(rewards):
        tree.joint_actions.append(JointAction(node=a // 2, choice=(a % 2,) * 2, reward=reward))
    tree.joint_actions[0].child, tree.joint_actions[1].child = 2, 3
    return tree


REWARDS = [1.0, 0.0, 2.0, 1.0, 0.5, 1.5, 2.0, 0.0]
DISCOUNT = 0.5
# Rollout-time values per joint action. V: one per node (nodes 0..3), so the two joint actions of a node share it.
IAC_V = [[0.5, 0.5, 0.2, 0.2, 1.0, 1.0, 0.0, 0.0], [0.3, 0.3, 0.1, 0.1, 0.6, 0.6, 0.8, 0.8]]
IAC_Q = [[0.4, 0.6, 0.1, 0.3, 1.0, 2.0, -1.0, 0.0], [0.2, 0.2, 0.5, 0.5, 0.0, 0.4, 1.2, 0.6]]
MAAC_V = [0.4, 0.4, 0.0, 0.0, 1.2, 1.2, -0.4, -0.4]
MAAC_Q = [0.5, 0.1, 0.7, 0.9, 0.8, 1.6, 0.2, -0.6]
# By hand: joint action 0 bootstraps from node 2 (joint actions 4, 5), 1 from node 3 (6, 7), with discount 0.5;
# 2 and 3 (row 1 ended early) and 4..7 (the last turn) are their rewards.
#   IAC V, agent 0: 1.0 + 0.5 * 1.0 = 1.5;  0.0 + 0.5 * 0.0 = 0.0
#          agent 1: 1.0 + 0.5 * 0.6 = 1.3;  0.0 + 0.5 * 0.8 = 0.4
#   IAC Q, agent 0: 1.0 + 0.5 * (1.0 + 2.0) / 2 = 1.75;  0.0 + 0.5 * (-1.0 + 0.0) / 2 = -0.25
#          agent 1: 1.0 + 0.5 * (0.0 + 0.4) / 2 = 1.1;   0.0 + 0.5 * (1.2 + 0.6) / 2 = 0.45
#   MAAC V: 1.0 + 0.5 * 1.2 = 1.6;  0.0 + 0.5 * -0.4 = -0.2
#   MAAC Q: 1.0 + 0.5 * (0.8 + 1.6) / 2 = 1.6;  0.0 + 0.5 * (0.2 - 0.6) / 2 = -0.1
REST = [2.0, 1.0, 0.5, 1.5, 2.0, 0.0]
TARGETS = {
    "iac_v": [[1.5, 0.0, *REST], [1.3, 0.4, *REST]],
    "iac_q": [[1.75, -0.25, *REST], [1.1, 0.45, *REST]],
    "maac_v": [1.6, -0.2, *REST],
    "maac_q": [1.6, -0.1, *REST],
}
VALUES = {"iac_v": IAC_V, "iac_q": IAC_Q, "maac_v": MAAC_V, "maac_q": MAAC_Q}


@pytest.mark.parametrize("layout", TARGETS)
def test_td_targets_of_a_two_turn_tree_by_hand(layout):
    tree = two_turn_tree(REWARDS)
    values = torch.tensor(VALUES[layout])
    expected = torch.tensor(TARGETS[layout])
    assert torch.allclose(td_targets(torch.tensor(REWARDS), values, tree.children(), DISCOUNT), expected)
    assert torch.allclose(tree_td(tree, values, DISCOUNT).targets, expected)


def test_maac_with_each_agents_own_reward():
    # One centralized value row, a reward row per agent (agent 1 got 0 everywhere): (agents, A) targets
    rewards = torch.tensor([REWARDS, [0.0] * 8])
    targets = td_targets(rewards, torch.tensor(MAAC_Q), two_turn_tree(REWARDS).children(), DISCOUNT)
    assert torch.allclose(targets, torch.tensor([TARGETS["maac_q"], [0.6, -0.1, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]]))


def test_advantages_of_a_two_turn_tree_by_hand():
    tree = two_turn_tree(REWARDS)
    td = tree_td(tree, torch.tensor(IAC_V), DISCOUNT)
    # target - V, agent 0: [1.0, -0.5, 1.8, 0.8 | -0.5, 0.5, 2.0, 0.0]
    #             agent 1: [1.0, 0.1, 1.9, 0.9 | -0.1, 0.9, 1.2, -0.8]
    # standardised within each turn (|) with the population std: agent 0's turn 1 has mean 0.775 and std
    # sqrt(2.7275 / 4) = 0.8258, so (1.0 - 0.775) / 0.8258 = 0.2725, ...
    expected = [
        [0.2725, -1.5440, 1.2413, 0.0303, -1.0690, 0.0, 1.6036, -0.5345],
        [0.0392, -1.3718, 1.4501, -0.1176, -0.5020, 0.7529, 1.1294, -1.3804],
    ]
    assert torch.allclose(td.advantages, torch.tensor(expected), atol=1e-4)
    # MAAC V, not normalised: its targets minus its values
    raw = tree_td(tree, torch.tensor(MAAC_V), DISCOUNT, normalize=False).advantages
    assert torch.allclose(raw, torch.tensor([1.2, -0.6, 2.0, 1.0, -0.7, 0.3, 2.4, 0.4]))


def test_comlrls_own_setting_one_generation_two_turns():
    # K=1, one row, two turns: joint action 0 expanded into joint action 1. Each turn's group holds one sample,
    # which CoMLRL does not normalise. discount 0.9:
    #   agent 0: target 0.3 + 0.9 * 0.5 = 0.75, 0.8; advantages 0.75 - 0.1 = 0.65, 0.8 - 0.5 = 0.3
    #   agent 1: target 0.3 + 0.9 * -0.4 = -0.06, 0.8; advantages -0.06 - 0.2 = -0.26, 0.8 + 0.4 = 1.2
    tree = RolloutTree(
        nodes=[Node(0, 1, [], None, joint_actions=[0]), Node(0, 2, [], 0, joint_actions=[1])],
        joint_actions=[JointAction(0, (0, 0), 0.3, child=1), JointAction(1, (0, 0), 0.8)],
    )
    td = tree_td(tree, torch.tensor([[0.1, 0.5], [0.2, -0.4]]), discount=0.9)
    assert torch.allclose(td.targets, torch.tensor([[0.75, 0.8], [-0.06, 0.8]]))
    assert torch.allclose(td.advantages, torch.tensor([[0.65, 0.3], [-0.26, 1.2]]))


def test_bad_inputs_are_refused_by_name():
    tree = two_turn_tree(REWARDS)
    with pytest.raises(ValueError, match="td_targets: rewards .* joint actions"):
        td_targets(torch.tensor(REWARDS[:7]), torch.tensor(MAAC_V[:7]), tree.children())
    with pytest.raises(ValueError, match="td_targets: discount"):
        td_targets(torch.tensor(REWARDS), torch.tensor(MAAC_V), tree.children(), discount=1.5)
    tree.joint_actions[2].pruned = True  # as if branching had not continued it beside a continued sibling
    tree.joint_actions[3].child = 2
    with pytest.raises(ValueError, match="tree_td: .*branching"):
        tree_td(tree, torch.tensor(MAAC_V), DISCOUNT)
    with pytest.raises(ValueError, match="value_loss: value_clip_range=0.2 needs old_values"):
        value_loss(torch.zeros(2), torch.zeros(2), 1.0, value_clip_range=0.2)


def test_clipped_value_loss_is_comlrls_on_fixed_numbers():
    # CoMLRL's shared-head loss: value_loss_coef * mean(max((t - v)^2, (t - clip(v))^2)),
    # clip(v) = old + clamp(v - old, -0.2, 0.2).
    values = torch.tensor([0.5, 0.9, -0.2, 2.0], requires_grad=True)
    old = torch.tensor([0.4, 0.0, 0.3, 2.05])
    targets = torch.tensor([1.0, 1.0, 0.0, 1.0])
    # plain errors 0.25, 0.01, 0.04, 1.0; clipped values 0.5, 0.2, 0.1, 2.0 give 0.25, 0.64, 0.01, 1.0;
    # the larger of each: 0.25, 0.64, 0.04, 1.0, mean 0.4825, times 0.6 = 0.2895
    loss = value_loss(values, targets, 0.6, old_values=old, value_clip_range=0.2)
    assert loss.item() == pytest.approx(0.2895)
    # the clipped one of value 1 counts: no gradient reaches it; the others get 0.6 / 4 * 2 * (v - t)
    loss.backward()
    assert torch.allclose(values.grad, torch.tensor([-0.15, 0.0, -0.06, 0.3]))
    # unclipped (a separate critic, MAAC): 0.6 * mean(0.25, 0.01, 0.04, 1.0) = 0.195
    assert value_loss(values, targets, 0.6).item() == pytest.approx(0.195)


@pytest.fixture(scope="module")
def lm():
    tokenizer = make_tokenizer()
    tokenizer.padding_side = "left"
    prompts = tokenizer(["Describe a city in the clouds:", "Design a playground"], return_tensors="pt", padding=True)
    return tokenizer, prompts


def test_v_reads_the_prompts_last_token_whole_sequence_or_prompt_alone(lm):
    tokenizer, prompts = lm
    model, head = make_model(tokenizer, seed=0), ValueHead(32)
    torch.nn.init.normal_(head.layers[-1].weight)  # values far from 0, so that a wrong position shows
    completion = torch.tensor([[5, 6, 7], [8, 9, tokenizer.pad_token_id]])
    ids = torch.cat([prompts.input_ids, completion], dim=1)
    mask = torch.cat([prompts.attention_mask, (completion != tokenizer.pad_token_id).long()], dim=1)
    with torch.no_grad():
        v_alone = head(last_hidden(model, prompts.input_ids, prompts.attention_mask))
        last = prompts.input_ids.size(1) - 1
        v_inside = head(last_hidden(model, ids, mask, positions=torch.tensor([last, last])))
        q = head(last_hidden(model, ids, mask))  # the last completion token: position 7 of row 0, 6 of row 1
        q_by_hand = head(model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states[-1])
    assert torch.allclose(v_alone, v_inside, atol=1e-5)
    assert torch.allclose(q, torch.stack([q_by_hand[0, last + 3], q_by_hand[1, last + 2]]))
    assert not torch.allclose(q, v_inside, atol=1e-3)


def grads(module) -> list[bool]:
    return [p.grad is not None and bool(p.grad.abs().sum() > 0) for p in module.parameters()]


@pytest.mark.parametrize("critic", ["separate", "detached", "shared"])
def test_where_the_value_loss_gradient_goes(lm, critic):
    tokenizer, prompts = lm
    actor, head = make_model(tokenizer, seed=0), ValueHead(32)
    backbone = make_model(tokenizer, seed=1) if critic == "separate" else actor
    hidden = last_hidden(backbone, prompts.input_ids, prompts.attention_mask)
    values = head(hidden.detach() if critic == "detached" else hidden)
    value_loss(values, torch.tensor([1.0, -1.0]), 0.6).backward()
    assert all(grads(head))
    if critic == "separate":  # the critic's backbone learns, the actor does not
        assert all(grads(backbone)) and not any(grads(actor))
    elif critic == "detached":  # the head alone
        assert not any(grads(actor))
    else:  # a head on the actor: the loss reaches the actor's backbone, as in CoMLRL's shared model
        assert all(grads(actor))
