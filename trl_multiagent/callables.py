"""Calling conventions of the user's transition functions, and checks of what they return; the helpers that bind a
user function's keywords (shared with `rewards`).

Rewards: see `rewards`.

Transition::

    transition(prompt, agent_completions, num_agents, *, prompt_history_per_agent, response_history_per_agent,
               turn, reward, <dataset columns>)

gets one branch (one joint action) and returns the next prompt of each agent: N strings, or N chat message lists.
The three required values are passed by name when the function names all three (in any order), or has fewer than
three positional parameters (``def t(**kwargs)``, ``def t(*, agent_completions, **kwargs)``), and by position
otherwise (``def t(p, completions, n, **history)``).
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Callable, Sequence
from typing import Any


def callable_name(func: Callable) -> str:
    return getattr(func, "__name__", None) or type(func).__name__


def accepted_keywords(func: Callable) -> tuple[set[str], bool]:
    """Names the function accepts as keywords, and whether it takes ``**kwargs``."""
    params = inspect.signature(func).parameters.values()
    names = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return names, any(p.kind == p.VAR_KEYWORD for p in params)


def pick_keywords(func: Callable, available: dict[str, Any]) -> dict[str, Any]:
    names, takes_any = accepted_keywords(func)
    return dict(available) if takes_any else {k: v for k, v in available.items() if k in names}


def unbound_parameters(
    func: Callable, args: Sequence, keywords: dict[str, Any], passed: Sequence[str], columns: Sequence[str]
) -> str:
    """Why a call with `args` and `keywords` leaves a required parameter unbound: it names neither a keyword the
    trainer passes nor a dataset column (the usual cause is a column the dataset lacks); "" when none is left."""
    params = list(inspect.signature(func).parameters.values())
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    filled = {p.name for p in positional[: len(args)]} | set(keywords)
    unknown = [
        p.name
        for p in params
        if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in filled
    ]
    if not unknown:
        return ""
    return (
        f" {', '.join(map(repr, unknown))} {'is' if len(unknown) == 1 else 'are'} neither a column of the dataset "
        f"(columns other than 'prompt': {sorted(columns) or 'none'}) nor a keyword the trainer passes "
        f"({list(passed)}): add the column to the dataset, give the parameter a default, or remove it."
    )


_loop: asyncio.AbstractEventLoop | None = None


def run_awaitable(result):
    """The value of a sync or async user function's result.

    An awaitable runs to completion on one long-lived event loop in a background thread (as TRL runs async rewards),
    so that it works when the caller already runs a loop (a Jupyter notebook) and keeps its clients across calls.
    """
    if not inspect.isawaitable(result):
        return result
    global _loop
    if _loop is None:
        _loop = asyncio.new_event_loop()
        threading.Thread(target=_loop.run_forever, name="trl_multiagent-async", daemon=True).start()

    async def wait():
        return await result

    return asyncio.run_coroutine_threadsafe(wait(), _loop).result()


class Transition:
    """The user's external transition, called once per branch that goes on to the next turn."""

    REQUIRED = ("prompt", "agent_completions", "num_agents")
    # `environments` only with an environment factory: the branch's world, once per agent (`environments.worlds`)
    HISTORY = ("prompt_history_per_agent", "response_history_per_agent", "turn", "reward", "environments")

    def __init__(self, func: Callable, num_agents: int, conversational: bool, columns: Sequence[str] = ()):
        self.func = func
        self.name = callable_name(func)
        self.num_agents = num_agents
        self.conversational = conversational
        if not callable(func):
            raise TypeError(f"external_transition is not callable: got {type(func).__name__}.")
        signature = inspect.signature(func)
        names, _ = accepted_keywords(func)
        positional = [
            p.name for p in signature.parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        takes_any_positional = any(p.kind is p.VAR_POSITIONAL for p in signature.parameters.values())
        # By name when it names all three, or cannot take them by position (keyword-only, or `**kwargs`)
        self.by_name = set(self.REQUIRED) <= names or (len(positional) < 3 and not takes_any_positional)
        convention = (
            f"external_transition {self.name!r}{signature} must take (prompt, agent_completions, num_agents): by "
            "these names, in any order (keyword-only or through **kwargs too), or as its first three positional "
            "parameters"
        )
        if not self.by_name:
            misplaced = [k for i, k in enumerate(self.REQUIRED) if k in names and positional.index(k) != i]
            if misplaced:
                raise TypeError(f"{convention}; it names {misplaced} at another position.")
        history = pick_keywords(func, dict.fromkeys([*self.HISTORY, *columns]))
        args, keywords = self._arguments(None, None, history)
        try:
            signature.bind(*args, **keywords)
        except TypeError as err:
            unknown = unbound_parameters(func, args, keywords, [*self.REQUIRED, *self.HISTORY], columns)
            raise TypeError(f"{convention}, plus the history keywords it names ({err}).{unknown}") from None

    def _arguments(self, prompt, agent_completions, history: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
        """(positional, keyword) arguments of one call, by this function's binding rule."""
        required = (prompt, agent_completions, self.num_agents)
        keywords = pick_keywords(self.func, history)
        if self.by_name:
            return (), {**dict(zip(self.REQUIRED, required, strict=True)), **keywords}
        return required, {k: v for k, v in keywords.items() if k not in self.REQUIRED}

    def __call__(self, prompt, agent_completions: list[str], turn: int, history: dict[str, Any]) -> list:
        return self.many([(prompt, agent_completions, history)], turn)[0]

    def many(self, calls: list[tuple[Any, list[str], dict[str, Any]]], turn: int) -> list[list]:
        """The next prompts of several branches, `(prompt, agent_completions, history)` each; an async transition runs
        them concurrently on one event loop, so one that calls a model or an API does not serialise the turn."""
        results = []
        for prompt, agent_completions, history in calls:
            args, keywords = self._arguments(prompt, agent_completions, {**history, "turn": turn})
            results.append(self.func(*args, **keywords))
        if any(inspect.isawaitable(r) for r in results):
            results = run_awaitable(_gather(results))
        return [check_prompts(self.name, r, self.num_agents, turn, self.conversational) for r in results]


async def _gather(results: list) -> list:
    return await asyncio.gather(*(r if inspect.isawaitable(r) else _value(r) for r in results))


async def _value(value):
    return value


def check_prompts(name: str, result: Any, num_agents: int, turn: int, conversational: bool) -> list:
    where = f"external_transition {name!r} (after turn {turn})"
    if isinstance(result, (str, bytes)) or not isinstance(result, Sequence):
        raise TypeError(
            f"{where} must return a list of {num_agents} prompts, one per agent; got {short_repr(result)}."
        )
    result = list(result)
    if len(result) != num_agents:
        raise ValueError(
            f"{where} returned {len(result)} prompts for {num_agents} agents; it must return one per agent. "
            f"Got: {short_repr(result)}."
        )
    for i, p in enumerate(result):
        check_prompt(f"{where}, agent {i}'s prompt", p, conversational)
    return result


def check_prompt(where: str, prompt: Any, conversational: bool, blank_ok: bool = False) -> None:
    """One agent's prompt: a non-blank string, or a non-empty list of chat messages (a blank prompt would reach
    `generate` with no token at all). `blank_ok`: an environment's `reset` completes it (TRL's convention)."""
    is_messages = isinstance(prompt, list) and all(isinstance(m, dict) and "content" in m for m in prompt)
    if not (isinstance(prompt, str) or is_messages):
        raise TypeError(
            f"{where} is a {type(prompt).__name__}; it must be a string"
            f"{' or a list of chat messages' if conversational else ''}. Got: {short_repr(prompt)}."
        )
    blank = not prompt.strip() if isinstance(prompt, str) else not any(str(m["content"]).strip() for m in prompt)
    if blank and not blank_ok:
        raise ValueError(f"{where} is empty ({short_repr(prompt)}); give every agent a prompt with some text.")


def short_repr(value: Any, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
