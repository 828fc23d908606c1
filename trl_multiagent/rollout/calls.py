"""One completion's tool calls, run as TRL runs them: sync tools in call order, async ones together on one event
loop; a tool that raises, or an unknown tool, gives ``{"error": ...}`` as its result and counts as a failure.

Used by the tool loop (`rollout.tools`) and by replay (`rollout.forks`), which runs a branch's recorded calls again
the same way.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import Any

from .callables import _run


def call_tools(tool_calls: list[dict], tools: dict[str, Callable]) -> tuple[list[dict], int]:
    """Run one completion's tool calls (async ones together on one event loop); the tool messages, in call order, and
    how many failed. A failure gives ``{"error": ...}`` as the tool's result, as in TRL.

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
            results.append((name, tools[name](**call["function"]["arguments"])))
        except Exception as err:
            results.append((name, err))
    pending = [i for i, (_, value) in enumerate(results) if inspect.isawaitable(value)]
    if pending:
        done = _run(_together([results[i][1] for i in pending]))
        for i, value in zip(pending, done, strict=True):
            results[i] = (results[i][0], value)
    messages, failures = [], 0
    for name, value in results:
        if isinstance(value, BaseException):
            failures += 1
            value = {"error": str(value)}
        content = value if isinstance(value, list) else str(value)
        messages.append({"role": "tool", "name": name, "content": content})
    return messages, failures


async def _together(awaitables: list) -> list:
    """The awaitables' values (or exceptions), run concurrently. `asyncio.gather` is called here, inside the loop that
    runs it (`callables._run`'s): made on the calling thread it would attach to that thread's current or running loop,
    and the loop awaiting it would refuse it ("attached to a different loop")."""
    return await asyncio.gather(*awaitables, return_exceptions=True)
