"""The peers' credit options: branching (every / best / top m joint answers continue), per-agent advantage scaling
(Dr. MAS) and the team/own reward mix (PettingLLMs), on hand-built trees and random ones, then through the trainer."""

import random

import pytest
import torch
from conftest import SEED_PROMPTS, length_feedback, length_ratio_reward
from datasets import Dataset
from hypothesis import given, settings
from hypothesis import strategies as st

from trl_multiagent import MAGRPOConfig, MAGRPOTrainer, per_agent
from trl_multiagent.comlrl import config as comlrl_config
from trl_multiagent.credit import options as credit_options
from trl_multiagent.credit.returns import (
    agent_tree_returns,
    continued,
    credited_returns,
    group_advantages,
    joint_returns,
    mixed_rewards,
    team_advantages,
    tree_returns,
)
from trl_multiagent.demo.testing import make_model, make_tool_tokenizer
from trl_multiagent.rollout import Generation, run_rollout


def fake_generate(agent, prompts, k):
    return Generation(
        prompt_ids=[[len(p)] for p in prompts],
        completion_ids=[[agent, j] for _ in prompts for j in range(k)],
        completions=[f"a{agent}-k{j}|{p}" for p in prompts for j in range(k)],
    )


def grow(rows, *, k, turns, reward, num_agents=2, branching="all", top_m=None, threshold=None, own=None):
    def score(turn, tree, actions):
        if own is not None:
            for a in actions:
                tree.joint_actions[a].own_rewards = own(turn, tree, a)
        return [reward(turn, tree, a) for a in actions]

    def transition(turn, tree, actions):
        return [[f"t{turn + 1}:{a}"] * num_agents for a in actions]

    return run_rollout(
        rows, num_agents=num_agents, num_generations=k, num_turns=turns, joint_mode="aligned",
        termination_threshold=threshold, agent_prompts=lambda row: [row["prompt"]] * num_agents,
        generate=lambda agent, prompts, environments, samples: fake_generate(agent, prompts, samples), score=score,
        transition=transition, branching=branching, branching_top_m=top_m,
    )  # fmt: skip


def by_index(values_by_turn):
    """A reward of joint answer k at each turn: values_by_turn[turn][k]."""
    return lambda turn, tree, a: values_by_turn[turn][tree.joint_actions[a].choice[0]]


# ---------------------------------------------------------------------- branching, by hand


def test_best_only_three_turns_by_hand():
    """K=3, T=3, best only. Turn-1 rewards [0.2, 0.9, 0.5]: joint answer 1 continues. Turn-2 rewards [1.0, 0.0, 0.4]:
    joint answer 0 continues. Turn 3 rewards [0.3, 0.6, 0.0] (mean 0.3).

    Returns with discount 0.5: turn 3: the rewards. Turn 2: the continued one, 1.0 + 0.5 * 0.3 = 1.15; the pruned
    ones get the same future, 0.0 + 0.15 and 0.4 + 0.15. Turn 1: the future of joint answer 1 is the mean of turn 2's
    returns, (1.15 + 0.15 + 0.55) / 3 = 0.6167; every turn-1 joint answer carries 0.5 * 0.6167."""
    rewards = {1: [0.2, 0.9, 0.5], 2: [1.0, 0.0, 0.4], 3: [0.3, 0.6, 0.0]}
    tree = grow([{"prompt": "p"}], k=3, turns=3, reward=by_index(rewards), branching="best")
    assert [node.turn for node in tree.nodes] == [1, 2, 3]  # one node per turn
    assert [a.child is not None for a in tree.joint_actions[:3]] == [False, True, False]
    assert [a.pruned for a in tree.joint_actions[:6]] == [True, False, True, False, True, True]
    assert not any(a.pruned for a in tree.joint_actions[6:])  # the last turn ends every branch: none is pruned
    returns = tree_returns(tree, discount=0.5)
    turn2_future = (1.15 + 0.15 + 0.55) / 3
    expected = [0.2 + 0.5 * turn2_future, 0.9 + 0.5 * turn2_future, 0.5 + 0.5 * turn2_future, 1.15, 0.15, 0.55]
    assert returns == pytest.approx(expected + [0.3, 0.6, 0.0])
    # Siblings differ by their own reward only: the group advantages (scale none) are the centred rewards.
    credited = credited_returns(tree, [returns, returns])
    for node, turn in zip(range(3), (1, 2, 3), strict=True):
        centred = torch.tensor(rewards[turn]) - sum(rewards[turn]) / 3
        torch.testing.assert_close(group_advantages(credited[node], "none")[0], centred, rtol=0, atol=1e-6)


def test_top_two_expands_the_two_best_and_ties_go_to_the_earlier():
    rewards = {1: [0.5, 0.9, 0.5, 0.1], 2: [0.0, 1.0, 0.0, 0.0]}
    tree = grow([{"prompt": "p"}], k=4, turns=2, reward=by_index(rewards), branching="top", top_m=2)
    turn1 = tree.joint_actions[:4]
    assert [a.child is not None for a in turn1] == [True, True, False, False]  # 0.9, then the first 0.5
    assert continued([0.5, 0.9, 0.5, 0.1], "top", 2) == [0, 1]
    # Pruned joint answers 2 and 3 get the mean future of 0 and 1 (each: mean of [0, 1, 0, 0] = 0.25)
    returns = tree_returns(tree, discount=1.0)
    assert returns[:4] == pytest.approx([0.75, 1.15, 0.75, 0.35])


def test_the_rollout_checks_its_branching_once_not_per_node(monkeypatch):
    """Given a name, the rollout looks its branching rule up once; given the strategy the trainer looked up once
    (`credit_options.CreditRules`), not at all: nothing is checked per node, and the tree is the same."""
    calls, check = [], credit_options.check_branching
    monkeypatch.setattr(credit_options, "check_branching", lambda *given: calls.append(given) or check(*given))
    rewards = by_index({1: [0.5, 0.9, 0.5, 0.1], 2: [0.0, 1.0, 0.0, 0.3], 3: [0.2, 0.1, 0.0, 0.4]})
    rows = [{"prompt": "p"}, {"prompt": "q"}]
    named = grow(rows, k=4, turns=3, reward=rewards, branching="top", top_m=2)  # 2 + 4 nodes go on
    assert calls == [("top", 2)]
    looked_up = grow(rows, k=4, turns=3, reward=rewards, branching=credit_options.BRANCHINGS["top"], top_m=2)
    assert calls == [("top", 2)]
    assert [a.pruned for a in looked_up.joint_actions] == [a.pruned for a in named.joint_actions]
    assert sum(a.pruned for a in named.joint_actions) == 2 * 2 + 4 * 2


def test_branching_all_is_unchanged_and_ended_nodes_are_not_pruned():
    rewards = {1: [0.2, 0.9], 2: [0.1, 0.4]}
    full = grow([{"prompt": "p"}], k=2, turns=2, reward=by_index(rewards))
    assert not any(a.pruned for a in full.joint_actions)
    assert len(full.nodes) == 3
    # Early termination ends the node: nothing continues and nothing is pruned (the return is the reward alone).
    ended = grow([{"prompt": "p"}], k=2, turns=2, reward=by_index(rewards), branching="best", threshold=0.1)
    assert len(ended.nodes) == 1 and not any(a.pruned for a in ended.joint_actions)
    assert tree_returns(ended, 1.0) == pytest.approx([0.2, 0.9])


def test_pruned_return_needs_a_continued_sibling():
    with pytest.raises(ValueError, match="pruned joint action 1"):
        joint_returns([1.0, 0.0], [[], []], pruned={1: []})


@settings(max_examples=60, deadline=None)
@given(
    num_agents=st.integers(1, 3),
    k=st.integers(2, 4),
    turns=st.integers(1, 4),
    branching=st.sampled_from(["all", "best", "top"]),
    top_m=st.integers(1, 3),
    discount=st.floats(0.0, 1.0),
    rows=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)
def test_random_branching_trees(num_agents, k, turns, branching, top_m, discount, rows, seed):
    """On random rewards: each node that goes on continues exactly the `expanded` best joint answers; completions
    per agent and prompt are K * (1 + m + ... + m**(T-1)) for m continued per node; a continued joint answer's return
    is its reward plus the discounted mean of its child's returns, a pruned one's its reward plus the mean future of
    its continued siblings."""
    if turns == 4 and branching == "all":
        turns = 3  # K**3 nodes at the last turn is enough
    rng = random.Random(seed)
    m = {"all": k, "best": 1, "top": min(top_m, k)}[branching]
    tree = grow(
        [{"prompt": f"p{r}"} for r in range(rows)], k=k, turns=turns, num_agents=num_agents,
        reward=lambda turn, tree, a: rng.choice([0.0, 0.25, 0.5, 1.0]), branching=branching,
        top_m=top_m if branching == "top" else None,
    )  # fmt: skip
    for node in tree.nodes:
        rewards = [tree.joint_actions[a].reward for a in node.joint_actions]
        kept = [j for j, a in enumerate(node.joint_actions) if tree.joint_actions[a].child is not None]
        if node.turn < turns:
            order = sorted(range(k), key=lambda j: (-rewards[j], j))
            assert kept == sorted(order[:m])
            assert [tree.joint_actions[a].pruned for a in node.joint_actions] == [j not in kept for j in range(k)]
        else:
            assert kept == [] and not any(tree.joint_actions[a].pruned for a in node.joint_actions)
    nodes_per_prompt = sum(m**t for t in range(turns))
    assert len(tree.nodes) == rows * nodes_per_prompt  # K completions per agent at each

    def future(a):
        child = tree.joint_actions[a].child
        kids = tree.nodes[child].joint_actions
        return sum(brute(c) for c in kids) / len(kids)

    def brute(a):
        action = tree.joint_actions[a]
        if action.child is not None:
            return action.reward + discount * future(a)
        if action.pruned:
            siblings = [s for s in tree.nodes[action.node].joint_actions if tree.joint_actions[s].child is not None]
            return action.reward + discount * sum(future(s) for s in siblings) / len(siblings)
        return action.reward

    assert tree_returns(tree, discount) == pytest.approx([brute(a) for a in range(len(tree.joint_actions))], abs=1e-9)


# ---------------------------------------------------------------------- per-agent scaling and the reward mix


def test_agent_scaling_divides_each_agent_by_its_own_std():
    """Two nodes, two agents, K=3; agent 1's returns are on another scale. "agent": agent i's group advantages
    divided by the std of all of agent i's returns; "batch": by the std of every return."""
    credited = torch.tensor(
        [[[0.0, 1.0, 2.0], [0.0, 50.0, 100.0]], [[1.0, 1.0, 4.0], [10.0, 10.0, 40.0]]], dtype=torch.float32
    )
    centred = credited - credited.mean(dim=2, keepdim=True)
    agent = team_advantages(credited, "agent", "mean")
    for i in range(2):
        torch.testing.assert_close(agent[:, i], centred[:, i] / (credited[:, i].std() + 1e-4))
    batch = team_advantages(credited, "batch", "mean")
    torch.testing.assert_close(batch, centred / (credited.std() + 1e-4))
    # The scales: with "batch" agent 1's advantages are about 50 times agent 0's; with "agent" within a factor of 2.
    assert batch[:, 1].abs().max() / batch[:, 0].abs().max() > 20
    assert agent[:, 1].abs().max() / agent[:, 0].abs().max() < 2


def test_mixed_rewards_reach_each_agents_returns():
    """Team reward 1.0 / 0.0 by joint answer; own rewards (agent 0's, agent 1's): joint answer 0 (0, 2), joint answer
    1 (4, 0). alpha = 0.5."""
    assert mixed_rewards([1.0, 0.0], [[0.0, 2.0], [4.0, 0.0]], 0.5) == [[0.5, 2.0], [1.5, 0.0]]
    rewards = {1: [1.0, 0.0], 2: [0.0, 0.0]}
    own = {1: [[0.0, 2.0], [4.0, 0.0]], 2: [[0.0, 0.0], [0.0, 0.0]]}
    tree = grow(
        [{"prompt": "p"}], k=2, turns=2, reward=by_index(rewards), branching="best",
        own=lambda turn, tree, a: own[turn][tree.joint_actions[a].choice[0]],
    )  # fmt: skip
    per_agent = agent_tree_returns(tree, discount=1.0, team_weight=0.5)
    assert per_agent[0][:2] == pytest.approx([0.5, 2.0])  # turn 2 adds 0 to both
    assert per_agent[1][:2] == pytest.approx([1.5, 0.0])
    assert agent_tree_returns(tree, 1.0, team_weight=1.0) == [tree_returns(tree, 1.0)] * 2
    credited = credited_returns(tree, per_agent)
    # agent 0 prefers joint answer 1, agent 1 joint answer 0
    torch.testing.assert_close(credited[0], torch.tensor([[0.5, 2.0], [1.5, 0.0]]))


# ---------------------------------------------------------------------- through the trainer


def config(tmp_path, **overrides):
    values = dict(
        output_dir=str(tmp_path / "run"), num_generations=2, per_device_train_batch_size=4, max_new_tokens=6,
        max_steps=1, logging_steps=1, report_to="none", seed=0, check_functions_before_training=False,
        early_termination_threshold=None,
    )  # fmt: skip
    values.update(overrides)
    return MAGRPOConfig(**values)


def dataset(n=4):
    return Dataset.from_dict({"prompt": SEED_PROMPTS[:n]})


class CountingReward:
    __name__ = "counting_reward"

    def __init__(self):
        self.sizes = {}

    def __call__(self, completions1, completions2, turn, **kwargs):
        self.sizes.setdefault(turn, []).append(len(completions1))
        return length_ratio_reward(completions1, completions2)


@pytest.mark.parametrize("branching, top_m, per_turn", [("all", None, [2, 4, 8]), ("best", None, [2, 2, 2]),
                                                         ("top", 2, [2, 4, 8])])  # fmt: skip
def test_trainer_grows_the_branching_it_is_given(tmp_path, tokenizer, branching, top_m, per_turn):
    """K=2, T=3, 2 prompts per step: joint answers per prompt at each turn; with best only K per turn (K*T rows per
    agent and prompt), with top 2 = K every one."""
    reward = CountingReward()
    args = config(tmp_path, num_turns=3, branching=branching, branching_top_m=top_m)
    trainer = MAGRPOTrainer(
        model=[make_model(tokenizer, seed=i) for i in range(2)], processing_class=tokenizer, reward_funcs=reward,
        external_transition=length_feedback, train_dataset=dataset(), args=args,
    )  # fmt: skip
    trainer.train()
    assert [reward.sizes[t][0] // 2 for t in (1, 2, 3)] == per_turn
    tree = trainer.last_rollout
    assert len(tree.nodes) == 2 * sum(n // 2 for n in per_turn)


def test_trainer_mixes_own_rewards_into_each_agents_advantages(tmp_path, tokenizer):
    """A per-agent reward (each agent's completion length) and alpha = 0: each agent's credited returns are its own
    lengths (one turn), so its advantages are its own completions' centred lengths, not the team's mean."""

    @per_agent
    def length(completions, **kwargs):
        return [float(len(c)) for c in completions]

    args = config(tmp_path, team_reward_weight=0.0, scale_rewards="none")
    trainer = MAGRPOTrainer(
        model=[make_model(tokenizer, seed=i) for i in range(2)], processing_class=tokenizer, reward_funcs=[length],
        train_dataset=dataset(), args=args,
    )  # fmt: skip
    trainer.train()
    batches = trainer._generate_and_score_completions([{"prompt": p} for p in SEED_PROMPTS[:2] for _ in range(2)])
    tree, differs = trainer.last_rollout, False
    for i in range(2):
        lengths = torch.tensor([[float(len(c)) for c in node.completions[i]] for node in tree.nodes])
        own = (lengths - lengths.mean(dim=1, keepdim=True)).flatten()
        torch.testing.assert_close(batches["agents"][i]["advantages"][: own.numel()], own)
        team = torch.tensor([[tree.joint_actions[a].reward for a in node.joint_actions] for node in tree.nodes])
        differs |= not torch.allclose(own, (team - team.mean(dim=1, keepdim=True)).flatten())
    assert differs  # the team's reward (the agents' mean length) would give other advantages


def chat_dataset():
    return Dataset.from_dict({"prompt": [[{"role": "user", "content": p}] for p in SEED_PROMPTS]})


def chat_rows():
    return [{"prompt": [{"role": "user", "content": p}]} for p in SEED_PROMPTS[:2] for _ in range(2)]


class Referee:
    """A world whose `get_reward()` gives each agent its own reward (`per_agent_reward = True`): each joint answer acts
    on its own pooled instance, numbered as it is made, and agent 0 earns the number while agent 1 loses it."""

    per_agent_reward = True
    made = 0

    def __init__(self):
        Referee.made += 1
        self.number = Referee.made

    def reset(self, **row):
        pass

    def get_reward(self) -> list[float]:
        return [float(self.number), -float(self.number)]


@pytest.mark.parametrize("team_weight", [0.0, 1.0])
def test_an_environments_per_agent_reward_is_each_agents_own(tmp_path, team_weight):
    """Own rewards (n, -n) for joint answer n: their mean, the team's reward, is 0, so with team_reward_weight=1 every
    advantage is 0; with 0, agent 0 learns from n and agent 1 from -n: opposite advantages, not zero."""
    args = config(tmp_path, team_reward_weight=team_weight, scale_rewards="none", num_turns=1)
    tokenizer = make_tool_tokenizer()
    trainer = MAGRPOTrainer(
        model=[make_model(tokenizer, seed=i) for i in range(2)], processing_class=tokenizer, reward_funcs=[],
        environment_factory=Referee, train_dataset=chat_dataset(), args=args,
    )  # fmt: skip
    batches = trainer._generate_and_score_completions(chat_rows())
    tree = trainer.last_rollout
    numbers = [tree.joint_actions[a].own_rewards[0] for node in tree.nodes for a in node.joint_actions]
    assert len(set(numbers)) == len(numbers) == 4  # every joint answer its own world
    assert all(a.reward == 0.0 and a.own_rewards == [n, -n] for a, n in zip(tree.joint_actions, numbers, strict=True))
    first, second = (batches["agents"][i]["advantages"][:4] for i in range(2))
    if team_weight == 1.0:
        assert first.abs().max() == second.abs().max() == 0
    else:
        expected = torch.tensor(numbers).view(2, 2)
        torch.testing.assert_close(first, (expected - expected.mean(dim=1, keepdim=True)).flatten())
        torch.testing.assert_close(second, -first)
        assert first.abs().max() > 0


class TeamReferee(Referee):
    per_agent_reward = False


def test_an_environment_returning_a_list_without_saying_so_is_told_how(tmp_path):
    tokenizer = make_tool_tokenizer()
    trainer = MAGRPOTrainer(
        model=[make_model(tokenizer, seed=i) for i in range(2)], processing_class=tokenizer, reward_funcs=[],
        environment_factory=TeamReferee, train_dataset=chat_dataset(), args=config(tmp_path, num_turns=1),
    )  # fmt: skip
    with pytest.raises(
        ValueError, match=r"TeamReferee.get_reward\(\) returned \[\d+.0, -\d+.0\], a list.*per_agent_reward = True"
    ):
        trainer._generate_and_score_completions(chat_rows())


def test_a_reward_mix_without_per_agent_rewards_is_refused(tmp_path, tokenizer):
    with pytest.raises(ValueError, match=r"team_reward_weight=0.7 .* none of the reward functions"):
        MAGRPOTrainer(
            model=["no/such-model"] * 2, processing_class=tokenizer, reward_funcs=length_ratio_reward,
            train_dataset=dataset(), args=config(tmp_path, team_reward_weight=0.7),
        )  # fmt: skip
    with pytest.raises(ValueError, match=r"none of the reward functions \['TeamReferee'\].*per_agent_reward = True"):
        MAGRPOTrainer(
            model=["no/such-model"] * 2, processing_class=make_tool_tokenizer(), reward_funcs=[],
            environment_factory=TeamReferee, train_dataset=chat_dataset(),
            args=config(tmp_path, team_reward_weight=0.7, num_turns=1),
        )  # fmt: skip


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"branching": "greedy"}, r"branching must be one of \('all', 'best', 'top'\), got 'greedy'"),
        ({"branching": "top"}, r"branching='top' needs branching_top_m >= 1"),
        ({"branching": "best", "branching_top_m": 2}, r"branching_top_m=2 applies to branching='top' only"),
        ({"team_reward_weight": 1.5}, r"team_reward_weight must be in \[0, 1\], got 1.5"),
        (
            {"scale_rewards": "agents"},
            r"scale_rewards must be one of \('group', 'batch', 'agent', 'group_zscore', 'none'\)",
        ),
        ({"agent_learning_rates": [1e-5, float("nan")]}, r"agent_learning_rates must be finite numbers >= 0"),
        ({"agent_learning_rates": [1e-5], "num_agents": 2}, r"agent_learning_rates has 1 rates for num_agents=2"),
    ],
)
def test_bad_credit_options_are_refused_naming_the_field(tmp_path, fields, message):
    with pytest.raises(ValueError, match=message):
        config(tmp_path, **fields)


def test_max_turn_sequences_follows_branching(tmp_path):
    """The vLLM engines are sized for the largest turn: K per live node, 1 + ... nodes by branching."""
    sizes = {b: config(tmp_path, num_turns=3, num_generations=4, per_device_train_batch_size=8, branching=b,
                       branching_top_m=2 if b == "top" else None).max_turn_sequences(2)
             for b in ("all", "best", "top")}  # fmt: skip
    assert sizes == {"all": 4 * 2 * 16, "best": 4 * 2, "top": 4 * 2 * 4}


# ---------------------------------------------------------------------- the registry (`credit.options`)


def test_a_new_baseline_is_one_registration(tmp_path, monkeypatch):
    """A baseline registered in `credit_options.BASELINES`, and nowhere else, is accepted by MAGRPOConfig, used by
    `team_advantages`, and named to CoMLRL: the config, the credit functions and the CoMLRL names ask the registry."""
    with pytest.raises(ValueError, match=r"advantage_baseline must be one of \('mean', 'rloo', 'max', 'none'\), got"):
        config(tmp_path, advantage_baseline="median")
    median = credit_options.Baseline(lambda r: r - r.median(dim=1, keepdim=True).values, "the group median", "a toy")
    monkeypatch.setitem(credit_options.BASELINES, "median", median)
    args = config(tmp_path, advantage_baseline="median")
    credited = torch.tensor([[[1.0, 2.0, 6.0], [3.0, 0.0, 9.0]], [[0.0, 4.0, 5.0], [1.0, 1.0, 1.0]]])  # (2, 2, K=3)
    expected = torch.tensor([[[-1.0, 0.0, 4.0], [0.0, -3.0, 6.0]], [[-4.0, 0.0, 1.0], [0.0, 0.0, 0.0]]])
    torch.testing.assert_close(team_advantages(credited, "none", args.advantage_baseline), expected)
    group_std = credited.std(dim=2, keepdim=True)  # the default scaling, "group", still divides
    torch.testing.assert_close(team_advantages(credited, "group", "median"), expected / (group_std + 1e-4))
    with pytest.raises(ValueError, match="advantage_baseline must be one of .*'median'\\), got 'mode'"):
        config(tmp_path, advantage_baseline="mode")


def test_a_new_branching_rule_is_one_registration(tmp_path, monkeypatch):
    """A branching rule registered alone sizes the config's largest turn and chooses the continued joint actions."""
    two = credit_options.Branching(lambda choices, top_m: min(2, choices), "the two best", "a toy")
    monkeypatch.setitem(credit_options.BRANCHINGS, "two", two)
    args = config(tmp_path, num_turns=3, num_generations=4, per_device_train_batch_size=8, branching="two")
    assert args.max_turn_sequences(2) == 4 * 2 * 2**2  # K x 2 prompts x 2 children per node, over 2 more turns
    assert continued([0.2, 0.9, 0.5, 0.9], "two") == [1, 3]
    with pytest.raises(ValueError, match=r"branching_top_m=2 applies to branching='top' only; with branching='two'"):
        config(tmp_path, branching="two", branching_top_m=2)


@pytest.mark.parametrize("field", list(credit_options.REGISTRIES))
def test_every_option_says_what_it_does_and_where_it_comes_from(field):
    registry = credit_options.REGISTRIES[field]
    assert list(registry) == MAGRPOConfig.__dataclass_fields__[field].metadata["choices"]
    for name, option in registry.items():
        assert option.doc and option.paper, (field, name)


def test_comlrls_advantage_modes_are_baselines_of_the_core():
    assert comlrl_config.ADVANTAGE_MODES == {"mean": "mean", "rloo": "rloo", "max": "max", "raw": "none"}
    assert set(comlrl_config.ADVANTAGE_MODES.values()) <= set(credit_options.BASELINES)
