"""Async user functions run on one long-lived loop, also when the caller already runs an event loop (Jupyter); a
parameter the trainer cannot fill is named with what it could fill it from."""

import asyncio
import time

import pytest

from trl_multiagent.callables import Transition
from trl_multiagent.rewards.joint import JointReward


async def async_reward(completions1, completions2):
    await asyncio.sleep(0)
    return [float(len(a) + len(b)) for a, b in zip(completions1, completions2, strict=True)]


async def async_transition(prompt, agent_completions, num_agents):
    await asyncio.sleep(0)
    return [f"{prompt} / {answer}" for answer in agent_completions]


def test_async_functions_run_inside_a_running_event_loop():
    reward = JointReward([async_reward], None, num_agents=2)
    transition = Transition(async_transition, num_agents=2, conversational=False)

    async def notebook_cell():  # a running loop, as in Jupyter: asyncio.run() would refuse to nest
        values, _, _ = reward([["ab", "c"], ["d", "efg"]], 1, {})
        prompts = transition("task", ["x", "y"], 1, {})
        return values, prompts

    values, prompts = asyncio.run(notebook_cell())
    assert values == [3.0, 4.0]
    assert prompts == ["task / x", "task / y"]


def test_async_functions_share_one_loop():
    loops = []

    async def recording(completions1, completions2):
        loops.append(asyncio.get_running_loop())
        return [0.0] * len(completions1)

    reward = JointReward([recording], None, num_agents=2)
    for _ in range(3):
        reward([["a"], ["b"]], 1, {})
    assert len(loops) == 3 and loops[0] is loops[1] is loops[2]


def test_async_transitions_of_one_turn_run_concurrently():
    branches = 5
    entered = []

    async def waits_for_every_branch(prompt, agent_completions, num_agents):
        entered.append(prompt)
        # Each branch waits until all of them have started: run one after another, the first would time out.
        while len(entered) < branches:
            await asyncio.sleep(0.01)
            if time.monotonic() - start > 5:
                raise TimeoutError("the transitions did not run concurrently")
        return [prompt, prompt]

    transition = Transition(waits_for_every_branch, num_agents=2, conversational=False)
    start = time.monotonic()
    prompts = transition.many([(f"p{i}", ["a", "b"], {}) for i in range(branches)], turn=1)
    assert prompts == [[f"p{i}", f"p{i}"] for i in range(branches)]
    assert sorted(entered) == [f"p{i}" for i in range(branches)]


def test_a_reward_keyword_that_is_no_dataset_column_is_named_with_the_columns_and_keywords():
    def graded(completions1, completions2, *, answer):
        return [0.0] * len(completions1)

    message = (
        r"'graded' cannot be called .*missing a required argument: 'answer'\. 'answer' is neither a column of the "
        r"dataset \(columns other than 'prompt': \['question'\]\) nor a keyword the trainer passes "
        r"\(\['prompts', 'turn', 'trainer_state', 'rows', 'log_metric', 'log_extra', 'environments'\]\): "
        r"add the column"
    )
    with pytest.raises(TypeError, match=message):
        JointReward([graded], None, num_agents=2, columns=["question"])
    JointReward([graded], None, num_agents=2, columns=["answer"])  # the column is there: fine


def test_a_transition_parameter_that_is_no_dataset_column_is_named():
    def feedback(prompt, agent_completions, num_agents, *, rubric):
        return [prompt] * num_agents

    with pytest.raises(TypeError, match=r"'rubric' is neither a column of the dataset \(columns other than 'prompt': "
                                        r"none\) nor a keyword the trainer passes \(\['prompt', "):  # fmt: skip
        Transition(feedback, num_agents=2, conversational=False)


def test_keyword_only_transitions_get_every_keyword_they_name():
    """`def f(**kwargs)` and `def f(*, agent_completions, **kwargs)` are called by keyword (as CoMLRL calls
    transitions), each getting the three required values, the history and the row's columns it names."""
    from trl_multiagent.callables import Transition

    seen = {}

    def everything(**kwargs):
        seen["everything"] = kwargs
        return ["a", "b"]

    def named(*, agent_completions, topic, **kwargs):
        seen["named"] = (agent_completions, topic, kwargs)
        return ["c", "d"]

    def required_only(*, prompt, agent_completions, num_agents):
        seen["required_only"] = (prompt, agent_completions, num_agents)
        return ["e", "f"]

    history = {"prompt_history_per_agent": [["p"], ["p"]], "response_history_per_agent": [["x"], ["y"]], "reward": 0.5}
    for func in (everything, named, required_only):
        transition = Transition(func, 2, conversational=False, columns=["topic"])
        transition.many([("the prompt", ["x", "y"], {**history, "topic": "clouds"})], turn=1)
    assert seen["everything"] == {
        "prompt": "the prompt", "agent_completions": ["x", "y"], "num_agents": 2, **history, "topic": "clouds",
        "turn": 1,
    }  # fmt: skip
    assert seen["named"][:2] == (["x", "y"], "clouds")
    assert seen["named"][2]["prompt"] == "the prompt" and seen["named"][2]["num_agents"] == 2
    assert seen["required_only"] == ("the prompt", ["x", "y"], 2)
