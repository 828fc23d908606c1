"""`environment_factory` for a team, without a model: pooled worlds in turn 1, a fork per joint action after it
(copy, the environment's `_fork`, or replay), closed once.

The rollout's `generate` is a fake that makes each completion call its world's `add` tool through `call_tools` and
records the call, as the tool loop does, so the tests read what every world saw.
"""

import asyncio
import random
import threading

import pytest
from conftest import EVENT_LOOPS, under_event_loop

from trl_multiagent.environments import worlds as worlds_module
from trl_multiagent.environments.calls import call_tools
from trl_multiagent.environments.worlds import Worlds
from trl_multiagent.rewards.joint import JointReward
from trl_multiagent.rollout import Generation, run_rollout


class Counter:
    """A world with a counter and a log of the amounts added."""

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
        self.log.append(amount)
        return self.total

    def get_reward(self) -> float:
        return float(self.total)


def add_call(amount: int) -> dict:
    return {"type": "function", "function": {"name": "add", "arguments": {"amount": amount}}}


def fake_generate(seen, worlds, k, prompts_seen=None):
    """Completion c (of K per node) of agent 0 adds c+1 to its world, agent 1's adds 10(c+1); `prompts_seen`
    collects each call's (agent, prompts, samples per prompt)."""

    def generate(agent, prompts, environments, samples):
        if prompts_seen is not None:
            prompts_seen.append((agent, list(prompts), samples))
        for c, world in enumerate(environments or []):
            call = [add_call(10**agent * (c % k + 1))]  # agent 0 adds 1..K, agent 1 adds 10..10K
            messages, _ = call_tools(call, {tool.__name__: tool for tool in worlds.tools(world, agent)})
            worlds.record(world, agent, call, messages)
            seen.append((agent, id(world)))
        n = len(prompts) * samples
        return Generation([[len(p)] for p in prompts], [[2]] * n, ["x"] * n)

    return generate


def grow(worlds, rows, num_turns=2, k=2, threshold=None, prompts_seen=None):
    seen = []
    tree = run_rollout(
        rows, num_agents=2, num_generations=k, num_turns=num_turns, joint_mode="aligned",
        termination_threshold=threshold, agent_prompts=lambda row: [row["prompt"]] * 2,
        generate=fake_generate(seen, worlds, k, prompts_seen), score=lambda turn, tree, ids: [0.0] * len(ids),
        transition=lambda turn, tree, ids: [["next", "next"]] * len(ids), worlds=worlds,
    )  # fmt: skip
    return tree, seen


def first_turn_worlds(tree) -> list:
    return [tree.joint_actions[a].environment for node in tree.nodes if node.turn == 1 for a in node.joint_actions]


def test_each_branch_acts_on_its_own_fork_of_its_parents_world():
    tree, seen = grow(Worlds(Counter, num_agents=2), [{"prompt": "p", "start": 100}])
    root = tree.nodes[0]
    assert root.environment is None  # a root has no world of its own: each joint action has one
    turn1 = [tree.joint_actions[a] for a in root.joint_actions]
    # joint action k: agent 0 added k+1, then agent 1 added 10(k+1), on the same world, in that order
    assert [a.environment.total for a in turn1] == [111, 122]
    assert [a.environment.log for a in turn1] == [[1, 10], [2, 20]]
    assert len({id(a.environment) for a in turn1}) == 2
    for parent in turn1:
        child = tree.nodes[parent.child]
        assert child.environment is parent.environment  # the branch goes on in the world it left
        grand = [tree.joint_actions[a].environment for a in child.joint_actions]
        # each grandchild starts from the parent's state and never sees its sibling's additions
        assert [w.total for w in grand] == [parent.environment.total + 11, parent.environment.total + 22]
        assert [w.log for w in grand] == [parent.environment.log + [1, 10], parent.environment.log + [2, 20]]
        assert all(w is not child.environment for w in grand)
    assert [a.environment.total for a in turn1] == [111, 122]  # the grandchildren left their parents alone
    # a world is acted on by agent 0, then agent 1, each batched across every branch of the turn
    assert [agent for agent, _ in seen] == [0] * 2 + [1] * 2 + [0] * 4 + [1] * 4


class Counted(Counter):
    """Counts the instances its factory made, each instance's resets, and every close."""

    made = 0
    closings: list = []

    def __init__(self):
        type(self).made += 1
        self.resets = 0

    def reset(self, **row):
        self.resets += 1
        return super().reset(**row)

    def close(self):
        Counted.closings.append(self)  # the instance itself: ids of collected copies could repeat


def test_turn_1_joint_actions_get_distinct_pooled_instances_each_reset_with_the_row():
    Counted.made = 0
    worlds = Worlds(Counted, num_agents=2)  # TRL's probe: the pool's first instance
    rows = [{"prompt": "p", "start": 100}, {"prompt": "q", "start": 200}]
    tree, _ = grow(worlds, rows, num_turns=1, k=3)
    first = first_turn_worlds(tree)
    assert len({id(w) for w in first}) == 6 and Counted.made == 6  # no copy: one instance per joint action
    assert [w.row["start"] for w in first] == [100] * 3 + [200] * 3 and [w.resets for w in first] == [1] * 6
    assert [w.total for w in first] == [111, 122, 133, 211, 222, 233]
    # the next rollout is smaller (a final batch): it takes pooled instances again, reset with its row; none is made
    again = first_turn_worlds(grow(worlds, [{"prompt": "r", "start": 5}], num_turns=1, k=3)[0])
    assert Counted.made == 6 and [id(w) for w in again] == [id(w) for w in first[:3]]
    assert [w.resets for w in first] == [2] * 3 + [1] * 3 and [w.total for w in again] == [16, 27, 38]
    # a bigger one grows the pool by what it lacks
    grow(worlds, rows + [{"prompt": "s", "start": 0}], num_turns=1, k=3)
    assert Counted.made == 9


def test_close_is_called_once_per_instance_pooled_or_copied():
    Counted.made, Counted.closings = 0, []
    worlds = Worlds(Counted, num_agents=2)
    grow(worlds, [{"prompt": "p", "start": 0}], num_turns=2, k=2)  # 2 pooled in turn 1, 4 copies in turn 2
    assert Counted.closings == []
    worlds.release()  # the next rollout starts: its copies are done
    assert len(Counted.closings) == 4 and all(w.resets == 1 for w in Counted.closings)
    worlds.close()  # the end of training
    worlds.close()
    assert len(Counted.closings) == 6 and len({id(w) for w in Counted.closings}) == 6 and Counted.made == 2


def test_reset_receives_the_row_and_its_observation_joins_every_agents_prompt():
    row = {"prompt": [{"role": "user", "content": "count"}], "start": 5, "level": "easy"}
    (world,), prompts, _ = Worlds(Counter, num_agents=2).start(row, [row["prompt"], row["prompt"]], 1)
    assert world.row == row
    assert prompts == [[{"role": "user", "content": "count (counter at 5)"}]] * 2
    assert row["prompt"] == [{"role": "user", "content": "count"}]  # the dataset row is left as it was


class Dice(Counter):
    """Draws its task from the global random state, as TRL's IncrementEnv example does."""

    def reset(self, **row):
        super().reset(**row)
        self.target = random.randint(1, 10**9)
        return f" Reach {self.target}."


def test_the_resets_of_a_row_draw_the_same_task_from_the_global_random_state():
    random.seed(0)
    task, after = random.randint(1, 10**9), random.random()
    random.seed(0)
    worlds, prompts, own = Worlds(Dice, num_agents=2).start({"start": 0}, ["p", "p"], 3)
    assert [w.target for w in worlds] == [task] * 3 and prompts == [f"p Reach {task}."] * 2
    assert random.random() == after  # the random stream moved on as if the row had one world


class Unseeded(Counter):
    """Draws its own start, as a game served without a seed does: its own generator, not the row's or the global."""

    def reset(self, **row):
        super().reset(**row)
        self.target = random.Random().randint(1, 10**9)
        return f" Reach {self.target}."


def test_joint_actions_that_start_from_different_observations_each_get_their_own_prompts(caplog):
    worlds_module.logger.info_once.cache_clear()
    worlds, asked = Worlds({"own": Unseeded, "seeded": Dice}, num_agents=2), []
    rows = [{"prompt": "p", "start": 0, "environment": "own"}, {"prompt": "q", "start": 0, "environment": "seeded"}]
    with caplog.at_level("INFO"):
        tree, _ = grow(worlds, rows, num_turns=1, k=3, prompts_seen=asked)
    own, seeded = tree.nodes
    targets = [tree.joint_actions[a].environment.target for a in own.joint_actions]
    assert len(set(targets)) == 3  # three worlds, three starts
    # each joint action's completions were written for its own world's observation, in every agent's prompt
    assert own.own_prompts == [[f"p Reach {t}." for t in targets]] * 2 and own.prompts == ["p", "p"]
    assert [tree.action_prompts(a) for a in own.joint_actions] == [[f"p Reach {t}."] * 2 for t in targets]
    # the seeded row still shares one prompt per agent
    task = tree.joint_actions[seeded.joint_actions[0]].environment.target
    assert seeded.own_prompts is None and seeded.prompts == [f"q Reach {task}."] * 2
    assert {tree.joint_actions[a].environment.target for a in seeded.joint_actions} == {task}
    # one call per agent: one sample of each completion's prompt (the shared one repeated K times)
    expected = [f"p Reach {t}." for t in targets] + [f"q Reach {task}."] * 3
    assert asked == [(0, expected, 1), (1, expected, 1)]
    assert own.prompt_ids[0] == [[len(p)] for p in expected[:3]] and seeded.prompt_ids[1] == [[len(expected[3])]] * 3
    # the K completions of a row are still one group: the node has its K joint actions, K completions per agent
    assert len(own.joint_actions) == 3 and [len(c) for c in own.completions] == [3, 3]
    with caplog.at_level("INFO"):
        grow(worlds, rows, num_turns=1, k=3)  # said once
    assert caplog.text.count("returned different observations for the 3 joint actions of a row") == 1
    assert "are still one group" in caplog.text


def test_a_seeded_reset_keeps_one_prompt_sampled_k_times():
    asked = []
    tree, _ = grow(Worlds(Dice, num_agents=2), [{"prompt": "p", "start": 0}], num_turns=1, k=3, prompts_seen=asked)
    task = tree.joint_actions[0].environment.target
    assert tree.nodes[0].own_prompts is None
    assert asked == [(0, [f"p Reach {task}."], 3), (1, [f"p Reach {task}."], 3)]


class Cards(Counter):
    """Hidden information, as in Hanabi: each agent is told only its own card."""

    def reset(self, **row):
        super().reset(**row)
        return (
            (f" You hold {row['cards'][0]}.", None)
            if row.get("second_blind")
            else tuple(f" You hold {card}." for card in row["cards"])
        )


def test_a_reset_may_give_each_agent_its_own_observation():
    (world,), prompts, own = Worlds(Cards, num_agents=2).start({"start": 0, "cards": ["d1", "d0"]}, ["p", "q"], 1)
    assert prompts == ["p You hold d1.", "q You hold d0."] and own is None
    row = {"start": 0, "cards": ["d1", "d0"], "second_blind": True}
    assert Worlds(Cards, num_agents=2).start(row, ["p", "q"], 2)[1] == ["p You hold d1.", "q"]
    with pytest.raises(ValueError, match=r"Cards.reset\(\*\*row\) returned 3 observations .* for a team of 2"):
        Worlds(Cards, num_agents=2).start({"start": 0, "cards": ["a", "b", "c"]}, ["p", "q"], 1)


class Picture(Counter):
    def reset(self, **row):
        super().reset(**row)
        return [{"type": "text", "text": "a picture"}]  # TRL's content parts: every agent's


def test_trls_content_parts_are_every_agents_observation():
    chat = [{"role": "user", "content": "look"}]
    _, prompts, _ = Worlds(Picture, num_agents=2).start({"start": 0}, [chat, chat], 1)
    content = [{"type": "text", "text": "look"}, {"type": "text", "text": "a picture"}]
    assert prompts == [[{"role": "user", "content": content}]] * 2


class LockedUnseeded(Unseeded):
    def reset(self, **row):
        self.lock = threading.Lock()  # copy.deepcopy fails
        return super().reset(**row)


class LockedUnseededWithFork(LockedUnseeded):
    def _fork(self):
        twin = type(self).__new__(type(self))
        twin.__dict__.update({k: list(v) if k == "log" else v for k, v in self.__dict__.items() if k != "lock"})
        twin.lock = threading.Lock()
        return twin


def test_with_several_turns_a_start_that_can_be_neither_copied_nor_replayed_is_refused_by_name():
    refused = r"LockedUnseeded cannot be forked .* its reset draws its own start.*a seed.*LockedUnseeded._fork\(self\)"
    with pytest.raises(ValueError, match=refused):  # at build time, by the check
        Worlds(LockedUnseeded, num_agents=2).check({"start": 0}, ["p", "p"], 2, num_turns=2)
    with pytest.raises(ValueError, match=refused):  # and in a rollout
        grow(Worlds(LockedUnseeded, num_agents=2), [{"prompt": "p", "start": 0}], num_turns=2)
    # one turn needs no fork; a copy or the class's _fork carries each branch's own start on
    grow(Worlds(LockedUnseeded, num_agents=2), [{"prompt": "p", "start": 0}], num_turns=1)
    for cls in (Unseeded, LockedUnseededWithFork):
        tree, _ = grow(Worlds(cls, num_agents=2), [{"prompt": "p", "start": 0}], num_turns=2)
        for parent in tree.joint_actions[:2]:
            child = tree.nodes[parent.child]
            assert child.own_prompts is None and child.prompts == ["next", "next"]  # later turns: the transition's
            assert {tree.joint_actions[a].environment.target for a in child.joint_actions} == {
                parent.environment.target
            }


class Unreachable(Counter):
    def reset(self, **row):
        raise ConnectionError("the server is gone")


def test_a_reset_that_raises_names_the_environment_and_the_row():
    with pytest.raises(RuntimeError, match=r"Unreachable.reset\(\*\*row\) raised ConnectionError: the server is gone, on "
                       r"the row \{'prompt': 'p', 'start': 3\}") as caught:  # fmt: skip
        grow(Worlds(Unreachable, num_agents=2), [{"prompt": "p", "start": 3}], num_turns=1)
    assert isinstance(caught.value.__cause__, ConnectionError)


class Quiet(Counter):
    def reset(self, **row):
        super().reset(**row)


def test_a_dict_of_factories_is_routed_by_the_rows_environment_column():
    worlds = Worlds({"loud": Counter, "quiet": Quiet}, num_agents=2)
    (world,), prompts, _ = worlds.start({"prompt": "p", "start": 1, "environment": "quiet"}, ["p", "p"], 1)
    assert type(world) is Quiet and prompts == ["p", "p"] and "environment" not in world.row
    with pytest.raises(ValueError, match=r"environment='other'.*\['loud', 'quiet'\]"):
        worlds.start({"prompt": "p", "start": 1, "environment": "other"}, ["p", "p"], 1)


def test_get_reward_enters_the_joint_reward_under_reward_weights():
    worlds = Worlds(Counter, num_agents=2)
    (a,), _, _ = worlds.start({"start": 2}, ["p", "p"], 1)
    (b,), _, _ = worlds.start({"start": 7}, ["p", "p"], 1)

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
    (a,), _, _ = worlds.start({"start": 2}, ["p", "p"], 1)
    (b,), _, _ = worlds.start({"start": 7}, ["p", "p"], 1)

    async def judge(environments, **kwargs):
        await asyncio.sleep(0)
        return [env.total * 10.0 for env in environments]

    reward = JointReward([judge, *worlds.reward_funcs], [1.0, 0.5], num_agents=2)
    total, per_func, _ = under_event_loop(loop, lambda: reward([["x", "y"], ["z", "w"]], 1, {"environments": [a, b]}))
    assert per_func == [[20.0, 70.0], [2.0, 7.0]] and total == [21.0, 73.5]


class Locked(Counter):
    """Holds what cannot be copied (a connection, say): copy.deepcopy raises."""

    def reset(self, **row):
        super().reset(**row)
        self.lock = threading.Lock()


class LockedWithFork(Locked):
    def _fork(self):  # the environment's own fork hook: a new instance in the same state, with its own lock
        twin = LockedWithFork.__new__(LockedWithFork)
        twin.__dict__.update({k: list(v) if k == "log" else v for k, v in self.__dict__.items() if k != "lock"})
        twin.lock = threading.Lock()
        return twin


def three_turns(cls):
    worlds = Worlds(cls, num_agents=2)
    tree, _ = grow(worlds, [{"prompt": "p", "start": 0}], num_turns=3, k=2)
    return worlds, tree


@pytest.mark.parametrize("cls, method", [(Counter, "copy"), (LockedWithFork, "hook"), (Locked, "replay")])
def test_each_fork_method_gives_a_branch_its_parents_world(cls, method, caplog):
    worlds_module.logger.warning_once.cache_clear()
    with caplog.at_level("WARNING"):
        worlds, tree = three_turns(cls)
        three_turns(cls)  # a second rollout: not said again
    assert worlds.fork_methods == {cls: method}
    said = {"copy": "by copy.deepcopy", "hook": "by its own LockedWithFork._fork()", "replay": "by replay"}[method]
    assert caplog.text.count(f"the environment {cls.__name__} ") == 1 and said in caplog.text
    for parent in tree.joint_actions:
        if parent.child is None:
            continue
        before = (parent.environment.total, list(parent.environment.log))
        forks = [tree.joint_actions[a].environment for a in tree.nodes[parent.child].joint_actions]
        # each fork started from the parent's state (total and the log of every amount added), then its own turn
        assert [(w.total, w.log) for w in forks] == [
            (before[0] + 11, before[1] + [1, 10]),
            (before[0] + 22, before[1] + [2, 20]),
        ]
        assert (parent.environment.total, parent.environment.log) == before  # and left the parent alone
    # turn 3's worlds: three turns of joint actions 1 or 2 each
    third = sorted(a.environment.total for a in tree.joint_actions if tree.nodes[a.node].turn == 3)
    assert third == [33, 44, 44, 44, 55, 55, 55, 66]


def test_a_replayed_world_equals_its_parents_and_has_its_own_connection():
    worlds = Worlds(Locked, num_agents=2)
    tree, _ = grow(worlds, [{"prompt": "p", "start": 7}], num_turns=1, k=2)
    parent = first_turn_worlds(tree)[1]  # agent 0 added 2, agent 1 added 20
    fork = worlds.fork(parent, turn=2)
    assert (fork.total, fork.log, fork.row) == (29, [2, 20], parent.row) and fork is not parent
    assert fork.lock is not parent.lock and not fork.lock.locked()


class Flaky(Locked):
    """Not deterministic: what `add` returns depends on how often any instance was called."""

    calls = 0

    def add(self, amount: int) -> int:
        """Add to the counter.

        Args:
            amount: how much to add.
        """
        Flaky.calls += 1
        return super().add(amount) + Flaky.calls


def test_a_non_deterministic_environment_under_replay_fails_naming_the_class_the_turn_and_the_call():
    with pytest.raises(RuntimeError) as caught:
        grow(Worlds(Flaky, num_agents=2), [{"prompt": "p", "start": 0}], num_turns=2, k=2)
    message = str(caught.value)
    assert "replaying the environment Flaky for a branch of turn 2" in message
    assert "the call add({'amount': 1}) that agent 0 made in turn 1" in message
    assert "Make it deterministic" in message and "Flaky._fork(self)" in message


def test_the_build_time_check_resets_the_probe_alone_and_says_the_fork_method():
    Counted.made = 0
    worlds = Worlds(Counted, num_agents=2)
    first, second = worlds.check({"start": 4}, ["p", "p"], 2, num_turns=1)
    # as GRPOTrainer's pool after building: the probe alone, reset with the row for both placeholder joint actions
    assert first is second is worlds.pool.instances[None][0] and first.total == 4 and Counted.made == 1
    worlds = Worlds(Locked, num_agents=2)
    worlds.check({"start": 4}, ["p", "p"], 2, num_turns=2)
    assert worlds.fork_methods == {Locked: "replay"}
    one_turn = Worlds(Locked, num_agents=2)
    one_turn.check({"start": 4}, ["p", "p"], 2, num_turns=1)
    assert one_turn.fork_methods == {}  # one turn needs no fork, so none is tried


class Split(Counter):
    agent_tools = [["add"], ["peek"]]

    def peek(self) -> int:
        """Read the counter."""
        return self.total


def test_agent_tools_gives_each_agent_only_its_methods():
    worlds = Worlds(Split, num_agents=2)
    (world,), _, _ = worlds.start({"start": 3}, ["p", "p"], 1)
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
