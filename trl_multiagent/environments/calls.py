"""One completion's tool calls, run as TRL runs them: sync tools in call order, async ones together on one event
loop; a tool that raises, or an unknown tool, gives ``{"error": ...}`` as its result and counts as a failure.

Used by the tool loop (`rollout.tools`) and by replay (`environments.forks`), which runs a branch's recorded calls again
the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import threading
from collections.abc import Callable
from typing import Any

from ..callables import run_awaitable
from .faults import ToolCallTimeout


def call_tools(
    tool_calls: list[dict],
    tools: dict[str, Callable],
    timeout: float | None = None,
    lost: Callable[[dict, BaseException], BaseException | None] | None = None,
) -> tuple[list[dict], int]:
    """Run one completion's tool calls (async ones together on one event loop); the tool messages, in call order, and
    how many failed. A failure gives ``{"error": ...}`` as the tool's result, as in TRL. With a `timeout`
    (`MAGRPOConfig.tool_call_timeout`), a call still running after that many seconds fails: an async one is cancelled,
    a sync one (run on a worker thread, the only way to stop waiting for it) runs on, unwaited. `lost(call, error)`,
    given, sees each exception first: an exception it returns is raised instead of being given to the agent (an
    environment's world that is gone, `environments.faults`).

    >>> def add(a: int, b: int) -> int:
    ...     return a + b
    >>> call = lambda name, **arguments: {"type": "function", "function": {"name": name, "arguments": arguments}}
    >>> messages, failures = call_tools([call("add", a=1, b=2), call("mul", a=1), call("add", a=1)], {"add": add})
    >>> for message in messages:
    ...     print(message["content"])
    3
    {'error': 'Tool mul not found.'}
    {'error': "add() missing 1 required positional argument: 'b'"}
    >>> failures
    2
    """
    results: list[Any] = []
    for call in tool_calls:
        name = call.get("function", {}).get("name") or call.get("name", "unknown")
        try:
            if call.get("type") != "function":
                raise ValueError(f"Unsupported tool call type: {call.get('type')}")
            if name not in tools:
                raise ValueError(f"Tool {name} not found.")
            results.append((name, _called(name, tools[name], call["function"]["arguments"], timeout)))
        except Exception as err:
            results.append((name, err))
    pending = [i for i, (_, value) in enumerate(results) if inspect.isawaitable(value)]
    if pending:
        done = run_awaitable(_together([results[i] for i in pending], timeout))
        for i, value in zip(pending, done, strict=True):
            results[i] = (results[i][0], value)
    messages, failures = [], 0
    for call, (name, value) in zip(tool_calls, results, strict=True):
        if isinstance(value, BaseException) and lost is not None and (fatal := lost(call, value)) is not None:
            raise fatal from value
        if isinstance(value, BaseException):
            failures += 1
            value = {"error": str(value)}
        content = value if isinstance(value, list) else str(value)
        messages.append({"role": "tool", "name": name, "content": content})
    return messages, failures


def check_timeout(timeout) -> None:
    """`MAGRPOConfig.tool_call_timeout`: a positive number of seconds, or None."""
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0):
        raise ValueError(
            f"MAGRPOConfig: tool_call_timeout must be a positive number of seconds, or None (no limit), got {timeout!r}."
        )


def _timed_out(name: str, timeout: float) -> ToolCallTimeout:
    return ToolCallTimeout(f"Tool {name} timed out after {timeout:g} s.")  # what the agent reads


def _called(name: str, tool: Callable, arguments: dict, timeout: float | None):
    """`tool(**arguments)`: its value, or for an async tool its awaitable. A sync tool with a timeout runs on a daemon
    thread, waited for `timeout` seconds at most; past them it runs on unwaited and the call raises TimeoutError."""
    if timeout is None or inspect.iscoroutinefunction(tool):
        return tool(**arguments)
    box: dict[str, Any] = {}

    def run():
        try:
            box["value"] = tool(**arguments)
        except BaseException as err:  # raised on the calling thread below
            box["error"] = err

    thread = threading.Thread(target=run, name=f"trl_multiagent-tool-{name}", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise _timed_out(name, timeout)
    if "error" in box:
        raise box["error"]
    return box["value"]


async def _together(calls: list[tuple[str, Any]], timeout: float | None) -> list:
    """The values (or exceptions) of the awaitables of `calls` (`(name, awaitable)`), run concurrently, each cancelled
    past `timeout`. `asyncio.gather` is called here, inside the loop that runs it (`callables.run_awaitable`'s): made on the
    calling thread it would attach to that thread's current or running loop, and the loop awaiting it would refuse it
    ("attached to a different loop")."""

    async def one(name: str, awaitable):
        if timeout is None:
            return await awaitable
        # `asyncio.wait`, not `wait_for`: a TimeoutError the tool raises itself (its client's own limit, a lost world:
        # `environments.faults`) stays the tool's, and only the trainer's limit gives `ToolCallTimeout`.
        task = asyncio.ensure_future(awaitable)
        done, _ = await asyncio.wait({task}, timeout=timeout)
        if not done:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):  # its cancellation ends, as wait_for's
                await task
            raise _timed_out(name, timeout)
        return task.result()

    return await asyncio.gather(*(one(name, awaitable) for name, awaitable in calls), return_exceptions=True)
