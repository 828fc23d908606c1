"""When an environment's world is gone: its server died, or stopped answering.

TRL's rule for a tool that raises (its message goes back to the agent as ``{"error": ...}``, a failed call, and
training goes on) suits a bad call: the world is still there, in the state it was. It does not suit a world whose
server is gone. Every later call of that world fails too, its reward is read from a state that no longer exists, and
the step would train on it (and could save a checkpoint of that update). So a method of an environment that raises
one of these ends the rollout with `EnvironmentLost`, naming the environment, the row, the turn and the call, on
every process (`rollout.tree.run_rollout`, `distributed.sync_turn`):

* `ConnectionError` (refused, reset, aborted, a broken pipe: Python's own, and what OpenEnv's client raises when it
  cannot connect);
* a WebSocket closed under the client (``websockets.exceptions.ConnectionClosed``: OpenEnv's client when the server
  dies mid-session), or a transport error of ``requests`` or ``httpx``;
* `TimeoutError` raised by the method itself: its client's own limit (OpenEnv's ``message_timeout_s``) ran out, so the
  server stopped answering, and whether the action was applied is unknown;
* `EnvironmentLost`, which an environment may raise itself.

`MAGRPOConfig.tool_call_timeout` is another matter: past it a call fails as TRL's do (`ToolCallTimeout`), because
the trainer stopped waiting, not the world.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import sys


class EnvironmentLost(RuntimeError):
    """An environment's world is gone (its server died or stopped answering): the rollout cannot go on."""


class ToolCallTimeout(TimeoutError):
    """A tool call ran past `MAGRPOConfig.tool_call_timeout`: a failed call, as TRL counts them (not a lost world)."""


def is_lost(error: BaseException) -> bool:
    """Whether `error`, raised by an environment's method, means that its world is gone (the list above).

    >>> is_lost(ConnectionResetError("reset by peer")), is_lost(TimeoutError("no answer in 5 s"))
    (True, True)
    >>> is_lost(ValueError("not a legal move")), is_lost(ToolCallTimeout("Tool play timed out after 5 s."))
    (False, False)
    """
    if isinstance(error, ToolCallTimeout):
        return False
    lost: tuple[type, ...] = (
        EnvironmentLost,
        ConnectionError,
        TimeoutError,
        asyncio.TimeoutError,  # not TimeoutError before Python 3.11
        concurrent.futures.TimeoutError,
    )
    # The clients' own classes, looked up only where their package is already imported (none is a dependency).
    for module, name in (
        ("websockets.exceptions", "ConnectionClosed"),
        ("requests.exceptions", "ConnectionError"),
        ("requests.exceptions", "Timeout"),
        ("httpx", "TransportError"),
    ):
        cls = getattr(sys.modules.get(module), name, None)
        if isinstance(cls, type):
            lost += (cls,)
    return isinstance(error, lost)
