"""`environment_factory` for a team, without a model: one world per root, shared by the agents, a copy per branch.

The rollout's `generate` is a fake that calls each completion's tool on the world it acts on, so the tests read what
every world saw.
"""

import asyncio
import threading

import pytest
from conftest import EVENT_LOOPS, under_event_loop

from trl_multiagent.rollout import Generation, run_rollout
from trl_multiagent.rollout.rewards import JointReward
from trl_multiagent.rollout.worlds import Worlds


class Counter:
    """A world with a counter and a log of who added what."""

    def reset(self, **row):
        self.row = dict(row)
        self.total = row["start"]
        self.log = []
        return f" (counter at {self.total})"

    def add(self, amount: int) -> int:
        """Add to the counter.

        Args:
            amount: how much to add.
        """
        self.total += amount
        return self.total

    def get_reward(self) -> float:
        return float(self.total)


def fake_generate(seen):
    def generate(agent, prompts, environments):
        k = len(environments) // len(prompts) if prompts else 0
        for c, world in enumerate(environments or []):
            world.add(10**agent * (c % k + 1))  # agent 0 adds 1..K, agent 1 adds 10..10K
            world.log.append(agent)
            seen.append((agent, id(world)))
        n = len(prompts) * k
        return Generation([[1]] * len(prompts), [[2]] * n, ["x"] * n)

    return generate


def grow(worlds, rows, num_turns=2, k=2, threshold=None):
    seen = []
    tree = run_rollout(
        rows, num_agents=2, num_generations=k, num_turns=num_turns, joint_mode="aligned",
        termination_threshold=threshold, agent_prompts=lambda row: [row["prompt"]] * 2,
        generate=fake_generate(seen), score=lambda turn, tree, ids: [0.0] * len(ids),
        transition=lambda turn, tree, ids: [["next", "next"]] * len(ids), worlds=worlds,
    )  # fmt: skip
    return tree, seen


def test_each_branch_acts_on_its_own_copy_of_its_parents_world():
    tree, seen = grow(Worlds(Counter, num_agents=2), [{"prompt": "p", "start": 100}])
    root = tree.nodes[0]
    assert root.environment.total == 100 and root.environment.log == []  # the root's world is never acted on
    turn1 = [tree.joint_actions[a] for a in root.joint_actions]
    # joint action k: agent 0 added k+1, then agent 1 added 10(k+1), on the same world, in that order
    assert [a.environment.total for a in turn1] == [111, 122]
    assert all(a.environment.log == [0, 1] for a in turn1)
    assert len({id(a.environment) for a in turn1}) == 2
    for parent in turn1:
        child = tree.nodes[parent.child]
        assert child.environment is parent.environment  # the branch goes on in the world it left
        grand = [tree.joint_actions[a].environment for a in child.joint_actions]
        # each grandchild starts from the parent's state and never sees its sibling's additions
        assert [w.total for w in grand] == [parent.environment.total + 11, parent.environment.total + 22]
        assert all(w.log == [0, 1, 0, 1] for w in grand)
        assert all(w is not child.environment for w in grand)
    assert [a.environment.total for a in turn1] == [111, 122]  # the grandchildren left their parents alone
    # a world is acted on by agent 0, then agent 1, each batched across every branch of the turn
    assert [agent for agent, _ in seen] == [0] * 2 + [1] * 2 + [0] * 4 + [1] * 4


def test_reset_receives_the_row_and_its_observation_joins_every_agents_prompt():
    row = {"prompt": [{"role": "user", "content": "count"}], "start": 5, "level": "easy"}
    world, prompts = Worlds(Counter, num_agents=2).start(row, [row["prompt"], row["prompt"]])
    assert world.row == row
    assert prompts == [[{"role": "user", "content": "count (counter at 5)"}]] * 2
    assert row["prompt"] == [{"role": "user", "content": "count"}]  # the dataset row is left as it was


class Quiet(Counter):
    def reset(self, **row):
        super().reset(**row)


def test_a_dict_of_factories_is_routed_by_the_rows_environment_column():
    worlds = Worlds({"loud": Counter, "quiet": Quiet}, num_agents=2)
    world, prompts = worlds.start({"prompt": "p", "start": 1, "environment": "quiet"}, ["p", "p"])
    assert type(world) is Quiet and prompts == ["p", "p"] and "environment" not in world.row
    with pytest.raises(ValueError, match=r"environment='other'.*\['loud', 'quiet'\]"):
        worlds.start({"prompt": "p", "start": 1, "environment": "other"}, ["p", "p"])


def test_get_reward_enters_the_joint_reward_under_reward_weights():
    worlds = Worlds(Counter, num_agents=2)
    a, _ = worlds.start({"start": 2}, ["p", "p"])
    b, _ = worlds.start({"start": 7}, ["p", "p"])

    def length(c0, c1):
        return [float(len(x + y)) for x, y in zip(c0, c1, strict=True)]

    reward = JointReward([length, *worlds.reward_funcs], [0.5, 3.0], num_agents=2)
    assert reward.names == ["length", "Counter"]
    total, per_func, _ = reward([["ab", "c"], ["d", ""]], 1, {"environments": [a, b]})
    assert per_func == [[3.0, 1.0], [2.0, 7.0]]
    assert total == [0.5 * 3.0 + 3.0 * 2.0, 0.5 * 1.0 + 3.0 * 7.0]


class AsyncCounter(Counter):
    async def get_reward(self) -> float:  # an LLM judge, say: TRL allows it async
        await asyncio.sleep(0)
        return float(self.total)


@pytest.mark.parametrize("loop", EVENT_LOOPS)
def test_async_get_reward_and_async_rewards_run_under_any_event_loop(loop):
    worlds = Worlds(AsyncCounter, num_agents=2)
    a, _ = worlds.start({"start": 2}, ["p", "p"])
    b, _ = worlds.start({"start": 7}, ["p", "p"])

    async def judge(environments, **kwargs):
        await asyncio.sleep(0)
        return [env.total * 10.0 for env in environments]

    reward = JointReward([judge, *worlds.reward_funcs], [1.0, 0.5], num_agents=2)
    total, per_func, _ = under_event_loop(loop, lambda: reward([["x", "y"], ["z", "w"]], 1, {"environments": [a, b]}))
    assert per_func == [[20.0, 70.0], [2.0, 7.0]] and total == [21.0, 73.5]


class Locked(Counter):
    def reset(self, **row):
        super().reset(**row)
        self.lock = threading.Lock()


class LockedWithFork(Locked):
    def __deepcopy__(self, memo):
        twin = LockedWithFork.__new__(LockedWithFork)
        twin.__dict__.update({k: list(v) if k == "log" else v for k, v in self.__dict__.items() if k != "lock"})
        twin.lock = threading.Lock()
        return twin


def test_a_world_that_cannot_be_copied_gets_the_fix_and_one_with_its_own_copy_runs():
    with pytest.raises(TypeError, match=r"environment Locked cannot be copied.*Locked.__deepcopy__\(self, memo\)"):
        Worlds(Locked, num_agents=2).check({"start": 0}, ["p", "p"])
    tree, _ = grow(Worlds(LockedWithFork, num_agents=2), [{"prompt": "p", "start": 0}], num_turns=1)
    assert [tree.joint_actions[a].environment.total for a in tree.nodes[0].joint_actions] == [11, 22]


class Split(Counter):
    agent_tools = [["add"], ["peek"]]

    def peek(self) -> int:
        """Read the counter."""
        return self.total


def test_agent_tools_gives_each_agent_only_its_methods():
    worlds = Worlds(Split, num_agents=2)
    world, _ = worlds.start({"start": 3}, ["p", "p"])
    assert [t.__name__ for t in worlds.tools(world, 0)] == ["add"]
    assert [t.__name__ for t in worlds.tools(world, 1)] == ["peek"]
    assert worlds.tools(world, 1)[0].__self__ is world  # bound to this world
    Split.agent_tools = [["add"], ["nope"]]
    try:
        with pytest.raises(ValueError, match=r"Split.agent_tools\[1\].*\['nope'\]"):
            Worlds(Split, num_agents=2)
    finally:
        Split.agent_tools = [["add"], ["peek"]]


def test_an_environment_without_reset_is_refused_as_trl_does():
    class NoReset:
        def act(self) -> str:
            """Act."""
            return ""

    with pytest.raises(ValueError, match=r"NoReset.*must define a callable `reset\(\*\*row\)`"):
        Worlds(NoReset, num_agents=2)
