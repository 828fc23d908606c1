"""Property tests of the pure modules (tree, returns, credit, advantages) on random teams, trees and rewards."""

import random

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from trl_multiagent.credit import returns as credit
from trl_multiagent.credit.returns import group_advantages
from trl_multiagent.rollout import Generation, run_rollout


def fake_generate(agent, prompts, k):
    return Generation(
        prompt_ids=[[len(p)] for p in prompts],
        completion_ids=[[agent, j] for _ in prompts for j in range(k)],
        completions=[f"a{agent}-k{j}|{p}" for p in prompts for j in range(k)],
    )


@settings(max_examples=80, deadline=None)
@given(
    num_agents=st.integers(1, 4),
    k=st.integers(2, 5),
    turns=st.integers(1, 3),
    mode=st.sampled_from(["aligned", "cross"]),
    threshold=st.one_of(st.none(), st.floats(0.0, 1.0)),
    discount=st.floats(0.0, 1.0),
    rows=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)
def test_random_trees(num_agents, k, turns, mode, threshold, discount, rows, seed):
    per_node = k if mode == "aligned" else k**num_agents
    assume(rows * per_node ** (turns - 1) <= 400)  # keep the largest turn small
    rng = random.Random(seed)

    def score(turn, tree, actions):
        return [rng.random() for _ in actions]

    def transition(turn, tree, actions):
        return [[f"t{turn + 1}:{a}"] * num_agents for a in actions]

    tree = run_rollout(
        [{"prompt": f"p{r}"} for r in range(rows)], num_agents=num_agents, num_generations=k, num_turns=turns,
        joint_mode=mode, termination_threshold=threshold, agent_prompts=lambda row: [row["prompt"]] * num_agents,
        generate=lambda agent, prompts, environments, samples: fake_generate(agent, prompts, samples), score=score, transition=transition,
    )  # fmt: skip

    # Tree sizes: K or K**N joint actions per node; a node is expanded iff it is not the last turn and not ended.
    for node in tree.nodes:
        assert len(node.joint_actions) == per_node
        mean = sum(tree.joint_actions[a].reward for a in node.joint_actions) / per_node
        assert node.terminated == (node.turn < turns and threshold is not None and mean > threshold)
        expanded = [tree.joint_actions[a].child is not None for a in node.joint_actions]
        assert all(expanded) == (node.turn < turns and not node.terminated) and (all(expanded) or not any(expanded))
    assert sum(node.turn == 1 for node in tree.nodes) == rows

    # Returns against a brute-force recursion.
    def brute(action_id):
        action = tree.joint_actions[action_id]
        if action.child is None:
            return action.reward
        child = tree.nodes[action.child].joint_actions
        return action.reward + discount * sum(brute(c) for c in child) / len(child)

    returns = credit.tree_returns(tree, discount)
    assert returns == pytest.approx([brute(a) for a in range(len(tree.joint_actions))], rel=1e-9, abs=1e-12)

    # Credit: completion j of agent i gets the mean return of the joint actions it is part of, and each completion is
    # part of K**(N-1) joint actions in cross mode, one in aligned mode.
    credited = credit.credited_returns(tree, [returns] * num_agents)
    for node, per_agent in zip(tree.nodes, credited, strict=True):
        for i in range(num_agents):
            for j in range(k):
                members = [a for a in node.joint_actions if tree.joint_actions[a].choice[i] == j]
                assert len(members) == (1 if mode == "aligned" else k ** (num_agents - 1))
                expected = sum(returns[a] for a in members) / len(members)
                assert abs(float(per_agent[i, j]) - expected) < 1e-5

    # Group advantages: each (node, agent) group of K sums to zero before scaling, and "group" scaling divides each
    # group by its own std (+1e-4).
    groups = credited.flatten(0, 1)
    centred = group_advantages(groups, "none")
    assert centred.shape == (len(tree.nodes) * num_agents, k)
    assert torch.allclose(centred.sum(dim=1), torch.zeros(len(centred)), atol=1e-5)
    scaled = group_advantages(groups, "group")
    torch.testing.assert_close(scaled * (groups.std(dim=1, keepdim=True) + 1e-4), centred, rtol=1e-4, atol=1e-5)
