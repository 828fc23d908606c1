"""A world whose server is gone ends the rollout (`environments.faults`); every other failure of a call stays TRL's: the
agent reads ``{"error": ...}``. No server and no model here: the tool loop with scripted completions, and the
rollout's agreement (`local_sync`) that a multi-process run makes through `distributed.sync_turn`."""

import asyncio

import pytest

from trl_multiagent.environments.faults import EnvironmentLost
from trl_multiagent.environments.worlds import Worlds
from trl_multiagent.rollout.tools import tool_loop


class Remote:
    """A world on a "server": `fault` is what its next call raises (None: it answers)."""

    fault = None

    def reset(self, level, **row):
        self.level, self.moves = level, []

    def move(self, step: int) -> str:
        """Move.

        Args:
            step: how far.
        """
        if Remote.fault is not None:
            raise Remote.fault
        self.moves.append(step)
        return f"at {sum(self.moves)}"

    def get_reward(self) -> float:
        if Remote.fault is not None:
            raise Remote.fault
        return float(sum(self.moves))


def ping(host: str) -> str:
    """A plain tool (`tools=`), not a world's method.

    Args:
        host: where.
    """
    raise ConnectionRefusedError(f"{host} refused")


CALL = {"type": "function", "function": {"name": "move", "arguments": {"step": 2}}}
PING = {"type": "function", "function": {"name": "ping", "arguments": {"host": "x"}}}


def run_calls(worlds, world, calls, timeout=None, any_left=None, generated=None):
    """One completion of agent 1 acting on `world` with `calls`, then answering (`generated`: how many sequences each
    of the loop's generation calls got)."""
    generated = [] if generated is None else generated

    def more(ids):
        generated.append(len(ids))
        return [[9]] * len(ids), None

    tools = {"move": world.move, "ping": ping}
    results = tool_loop(
        [[1]], [[5]], None, [tools], parse=lambda c, ids, prefix: {"tool_calls": calls} if ids == [5] else {},
        suffix_ids=lambda messages: [7], generate_more=more, max_iterations=None, max_completion_length=50,
        timeout=timeout, any_left=any_left, lost=lambda c, call, error: worlds.lost(world, 1, call, error),
    )  # fmt: skip
    return results


@pytest.fixture
def world():
    Remote.fault = None
    worlds = Worlds(Remote, num_agents=2)
    (first,), _, _ = worlds.start({"level": 3}, [[{"role": "user", "content": "go"}]] * 2, count=1)
    yield worlds, first
    Remote.fault = None


@pytest.mark.parametrize(
    "fault", [ConnectionResetError("reset by peer"), TimeoutError("no answer in 5 s"), EnvironmentLost("gone")]
)
def test_a_world_that_is_gone_ends_the_rollout_naming_the_environment_the_row_and_the_call(world, fault):
    worlds, first = world
    Remote.fault = fault
    with pytest.raises(EnvironmentLost) as caught:
        run_calls(worlds, first, [CALL])
    message = str(caught.value)
    assert message.startswith(
        f"MAGRPOTrainer: the environment Remote is gone: agent 1's call move({{'step': 2}}) in turn 1 raised "
        f"{type(fault).__name__}: {fault}, on the row {{'level': 3}}."
    )
    assert caught.value.__cause__ is fault


def test_other_failures_stay_trls_a_message_to_the_agent(world):
    """A world's method raising ValueError (a bad move), a plain tool losing its connection, and a call past
    tool_call_timeout: each is a failed call the agent reads; the world goes on."""
    worlds, first = world
    Remote.fault = ValueError("not a legal move")
    results = run_calls(worlds, first, [CALL, PING])
    assert [m["content"] for m in results.messages[0][1:3]] == [
        "{'error': 'not a legal move'}",
        "{'error': 'x refused'}",
    ]
    assert results.failures == [2]

    Remote.fault = None

    async def slow(step: int) -> str:
        await asyncio.sleep(5)
        return "late"

    results = tool_loop(
        [[1]], [[5]], None, [{"move": slow}], parse=lambda c, ids, prefix: {"tool_calls": [CALL]} if ids == [5] else {},
        suffix_ids=lambda messages: [7], generate_more=lambda ids: ([[9]] * len(ids), None), max_iterations=None,
        max_completion_length=50, timeout=0.2, lost=lambda c, call, error: worlds.lost(first, 1, call, error),
    )  # fmt: skip
    assert results.messages[0][1]["content"] == "{'error': 'Tool move timed out after 0.2 s.'}"


def test_after_a_lost_world_the_process_still_joins_the_rounds_generation_then_stops(world):
    """Other processes may be generating this round: the process that lost its world calls no other tool, joins the
    round's generation with nothing to continue, and reports the error at the next agreement, where every process
    stops together (`any_left`: `distributed.sync_turn` in a multi-process run)."""
    worlds, first = world
    Remote.fault = ConnectionResetError("reset by peer")
    reported, generated = [], []

    def any_left(has_calls, error=None):
        reported.append((has_calls, type(error).__name__ if error else None))
        if error is not None:
            raise error
        return has_calls

    with pytest.raises(EnvironmentLost):
        run_calls(worlds, first, [CALL, CALL], any_left=any_left, generated=generated)
    assert reported == [(True, None), (False, "EnvironmentLost")]
    assert generated == [0]  # the round's generation, joined with nothing to continue
    assert first.moves == []  # no call went through


def test_a_reward_read_from_a_world_that_is_gone_names_the_row(world):
    worlds, first = world
    Remote.fault = ConnectionAbortedError("aborted")
    (column,) = worlds.reward_funcs
    with pytest.raises(EnvironmentLost, match=r"Remote is gone: get_reward\(\) raised ConnectionAbortedError: aborted, "
                       r"on the row \{'level': 3\}, turn 1"):  # fmt: skip
        column([""], [""], environments=[first])


def test_a_reset_that_loses_its_server_names_the_row():
    class Down(Remote):
        def reset(self, level, **row):
            raise ConnectionRefusedError("[Errno 111] Connect call failed")

    worlds = Worlds(Down, num_agents=2)
    with pytest.raises(EnvironmentLost, match=r"Down.reset\(\*\*row\) raised ConnectionRefusedError: .*on the row "):
        worlds.start({"level": 1}, [[{"role": "user", "content": "go"}]] * 2, count=2)
