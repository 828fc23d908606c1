"""The code-collaboration task's environment: prompts, the program the sandbox runs, how it ended, the joint reward and
the feedback between turns (`recipes/code_collab.py` trains on it; `recipes/sandbox.py` runs the programs).

See `code_collab`'s docstring for the reward levels.
"""

from __future__ import annotations

import ast
import os
import re
import threading
import warnings
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from sandbox import SandboxResult, run_python


HELPER_NAME = "aux"

SCORE_INVALID = 0.0
SCORE_CRASHED = 0.1
SCORE_FAILED_TESTS = 0.3
SCORE_PASSED = 1.0
BONUS_CALLS_HELPER = 0.1
# Every value `code_reward` can return: 0.0, 0.1, 0.2, 0.3, 0.4, 1.0, 1.1.
REWARD_LEVELS = tuple(
    sorted(
        {SCORE_INVALID}
        | {
            round(s + b, 6)
            for s in (SCORE_CRASHED, SCORE_FAILED_TESTS, SCORE_PASSED)
            for b in (0.0, BONUS_CALLS_HELPER)
        }
    )
)


# ------------------------------------------------------------------------------------------------------------- prompts


def helper_text(row: dict) -> str:
    entry = row["entry_point"]
    return (
        "You are agent 1 of 2. Together with agent 2 you solve this Python problem:\n\n"
        f"{row['prompt'].strip()}\n\n"
        f"Write a helper function named `{HELPER_NAME}` that makes `{entry}` easier to implement. Agent 2 writes "
        f"`{entry}` and may call `{HELPER_NAME}`. Write only `{HELPER_NAME}` (with the imports it needs), not "
        f"`{entry}`, in one ```python code block."
    )


def main_text(row: dict) -> str:
    entry = row["entry_point"]
    return (
        "You are agent 2 of 2. Together with agent 1 you solve this Python problem:\n\n"
        f"{row['prompt'].strip()}\n\n"
        f"Write the complete function `{entry}` with the signature above. Agent 1 writes a helper function "
        f"`{HELPER_NAME}` that you may call. Do not define `{HELPER_NAME}` yourself. Write `{entry}` (with the imports "
        "it needs) in one ```python code block."
    )


_OPEN_BLOCK = "\n```python\n"


def helper_prompt(row: dict) -> str:
    """Agent 1's first prompt, as plain text ending with an opened code block."""
    return helper_text(row) + _OPEN_BLOCK


def main_prompt(row: dict) -> str:
    """Agent 2's first prompt, as plain text ending with an opened code block."""
    return main_text(row) + _OPEN_BLOCK


def helper_chat(row: dict) -> list[dict]:
    return [{"role": "user", "content": helper_text(row)}]


def main_chat(row: dict) -> list[dict]:
    return [{"role": "user", "content": main_text(row)}]


def make_formatters(chat: bool) -> list:
    """The per-agent formatters: chat message lists for models with a chat template, plain text otherwise."""
    return [helper_chat, main_chat] if chat else [helper_prompt, main_prompt]


# ------------------------------------------------------------------------------------------------- reading the code


_FENCE = re.compile(r"```[^\n`]*\n(.*?)(?:```|\Z)", re.S)


def _compiles(code: str) -> bool:
    try:
        compile(code, "<completion>", "exec", dont_inherit=True)
    except Exception:  # SyntaxError, ValueError (null bytes), RecursionError, MemoryError on pathological input
        return False
    return True


def _defines(tree: ast.Module, name: str) -> bool:
    return any(isinstance(n, ast.FunctionDef) and n.name == name for n in tree.body)


def extract_code(completion: str, required: str | None = None) -> str:
    """The code in a completion: a fenced block, the text before a closing fence (prompts that opened the block), or
    the whole text; the first candidate that compiles and defines `required`, else the first that compiles."""
    candidates = []
    match = _FENCE.search(completion)
    if match:
        candidates.append(match.group(1))
    if "```" in completion:
        candidates.append(completion.split("```", 1)[0])
    candidates.append(completion)
    candidates = [c.strip("\n") + "\n" for c in candidates]
    compiling = [c for c in candidates if c.strip() and _compiles(c)]
    if required is not None:
        for code in compiling:
            if _defines(ast.parse(code), required):
                return code
    return compiling[0] if compiling else candidates[0]


def _binds(tree: ast.AST, name: str) -> bool:
    """Whether the code defines or assigns `name` anywhere (so a call to it would not reach agent 1's function)."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return True
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and node.id == name:
            return True
        if isinstance(node, ast.arg) and node.arg == name:
            return True
        if isinstance(node, ast.alias) and (node.asname or node.name) == name:
            return True
    return False


def calls_helper(main_code: str, entry_point: str) -> bool:
    """Whether agent 2's `entry_point` calls `aux` (agent 1's helper) and does not define `aux` itself."""
    try:
        tree = ast.parse(main_code)
    except Exception:
        return False
    if _binds(tree, HELPER_NAME):
        return False
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == entry_point:
            return any(
                isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == HELPER_NAME
                for n in ast.walk(node)
            )
    return False


# ----------------------------------------------------------------------------------------------- program and reward


HARNESS = """
def __magrpo_run_tests():
    import reprlib

    shown = reprlib.Repr()
    shown.maxstring, shown.maxother, shown.maxlist, shown.maxtuple, shown.maxdict, shown.maxlevel = 60, 60, 8, 8, 6, 3

    def show(value):
        try:
            return shown.repr(value)
        except BaseException:
            return "<unprintable>"

    plain_types = (bool, int, float, complex, str, bytes, type(None), list, tuple, dict, set, frozenset)

    def plain(value, depth=0):
        # Built-in values only: an object whose __eq__ always says True would pass every `==` test.
        if type(value) not in plain_types:
            return False
        if depth < 4 and isinstance(value, (list, tuple, set, frozenset)):
            return all(plain(v, depth + 1) for v in list(value)[:1000])
        if depth < 4 and isinstance(value, dict):
            return all(plain(k, depth + 1) and plain(v, depth + 1) for k, v in list(value.items())[:1000])
        return True

    last = []
    function = {entry}

    def candidate(*args, **kwargs):
        shown_args = [show(a) for a in args] + [k + "=" + show(v) for k, v in kwargs.items()]
        last[:] = ["{entry}(" + ", ".join(shown_args) + ")"]
        result = function(*args, **kwargs)  # __magrpo_call__
        if not plain(result):
            kind = type(result).__name__
            raise TypeError("{entry} returned a " + kind + ", not a plain built-in value")  # __magrpo_result__
        last.append(show(result))
        return result

    try:
        check(candidate)
    except BaseException as err:
        if last:
            note = "last call before the failure: " + last[0] + (" returned " + last[1] if len(last) > 1 else "")
            try:
                err.add_note(note)
            except AttributeError:
                err.__notes__ = [*getattr(err, "__notes__", []), note]
        raise


__magrpo_run_tests()
"""

SECTIONS = ("problem", "agent 1", "agent 2", "tests", "harness")


@dataclass(frozen=True)
class Program:
    code: str
    spans: dict  # section name -> (first line, last line), 1-based, inclusive
    call_line: int  # the harness line that calls the entry point
    result_line: int  # the harness line that refuses a result that is not a plain built-in value


def build_program(context: str, helper_code: str, main_code: str, test: str, entry_point: str) -> Program:
    """The problem's code, agent 1's code, agent 2's code, the tests and the harness that calls `check()`."""
    parts = [context, helper_code, main_code, test, HARNESS.replace("{entry}", entry_point)]
    lines, spans = [], {}
    for name, part in zip(SECTIONS, parts, strict=True):
        lines.append(f"# ---- {name} ----")
        body = part.rstrip("\n").split("\n")
        spans[name] = (len(lines) + 1, len(lines) + len(body))
        lines.extend(body)
        lines.append("")
    first = spans["harness"][0]  # the agents' code may contain the markers too: look in the harness only
    marked = {
        m: next(i + 1 for i, line in enumerate(lines) if i + 1 >= first and m in line)
        for m in ("__magrpo_call__", "__magrpo_result__")
    }
    return Program("\n".join(lines) + "\n", spans, marked["__magrpo_call__"], marked["__magrpo_result__"])


@dataclass(frozen=True)
class Outcome:
    """How one joint answer did: its reward, its level and a message for the feedback."""

    reward: float
    level: str  # "invalid" | "crashed" | "failed_tests" | "passed"
    calls_helper: bool
    message: str
    sandbox: SandboxResult | None = None


@dataclass
class SandboxSettings:
    """How `code_reward` runs programs; `main()` sets these from the command line."""

    timeout_s: float = 5.0
    memory_mb: int = 512
    file_size_mb: int = 16
    workers: int = 0  # programs run at once (threads, each waiting on its own process); 0: min(4, CPU count)
    backend: str | None = None  # None: $MAGRPO_SANDBOX or "bwrap"


SETTINGS = SandboxSettings()

_CACHE_SIZE = 4096
_cache: OrderedDict = OrderedDict()
_cache_lock = threading.Lock()


def _short(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _locate(program: Program, line: int) -> tuple[str, int]:
    for name, (first, last) in program.spans.items():
        if first <= line <= last:
            return name, line - first + 1
    return "harness", line


def _classify(program: Program, result: SandboxResult, entry_point: str) -> tuple[float, str, str]:
    """(score, level, message) of a program that compiled."""
    if result.passed:
        return SCORE_PASSED, "passed", "All tests passed."
    if result.status == "timeout":
        return SCORE_CRASHED, "crashed", f"The program timed out ({result.detail}): an infinite loop, or far too slow."
    if result.status == "crashed":
        return SCORE_CRASHED, "crashed", f"The program crashed: {_short(result.detail)}."
    if result.status == "error":
        warnings.warn(f"code_collab: the sandbox could not run a program: {result.detail}", stacklevel=3)
        return SCORE_INVALID, "invalid", f"The program could not be run: {_short(result.detail)}."
    if result.exception is None:
        return SCORE_CRASHED, "crashed", f"The program stopped before the tests finished: {result.detail}."
    exc = f"{result.exception}: {_short(result.message, 200)}" if result.message else result.exception
    notes = "".join(f" ({_short(n, 200)})" for n in result.notes)
    if not result.frames:
        return SCORE_CRASHED, "crashed", f"The program raised {exc}{notes}."
    line, source = result.frames[-1]
    section, local_line = _locate(program, line)
    if section == "harness" and line == program.call_line:
        return SCORE_CRASHED, "crashed", f"Calling `{entry_point}` raised {exc}{notes}."
    if section == "harness" and line == program.result_line:
        return SCORE_CRASHED, "crashed", f"{result.message}{notes}."
    if section in ("tests", "harness"):
        shown = f": `{_short(source, 200)}`" if source.strip() else ""
        return SCORE_FAILED_TESTS, "failed_tests", f"A test failed{shown} -> {exc}{notes}."
    where = {"agent 1": "agent 1's code", "agent 2": "agent 2's code", "problem": "the problem's code"}[section]
    return (
        SCORE_CRASHED,
        "crashed",
        f"The program raised {exc} in {where}, line {local_line}: `{_short(source, 200)}`{notes}.",
    )


def _static_check(helper_code: str, main_code: str, entry_point: str) -> str | None:
    """Why the pair cannot be run (not valid Python, or a required function missing), for each agent; or None."""
    problems = []
    for who, code, required in (("Agent 1", helper_code, HELPER_NAME), ("Agent 2", main_code, entry_point)):
        try:
            compile(code, "<completion>", "exec", dont_inherit=True)
            tree = ast.parse(code)
        except SyntaxError as err:
            problems.append(f"{who}'s code is not valid Python (line {err.lineno}: {err.msg}).")
            continue
        except Exception as err:
            problems.append(f"{who}'s code is not valid Python ({type(err).__name__}).")
            continue
        if not _defines(tree, required):
            problems.append(f"{who}'s code does not define the function `{required}`.")
    return " ".join(problems) or None


def evaluate(helper: str, main: str, test: str, entry_point: str, context: str = "") -> Outcome:
    """Score one joint answer (agent 1's completion, agent 2's completion) on one problem; cached."""
    helper_code = extract_code(helper, HELPER_NAME)
    main_code = extract_code(main, entry_point)
    key = (context, helper_code, main_code, test, entry_point, SETTINGS.timeout_s, SETTINGS.memory_mb)
    with _cache_lock:
        if key in _cache:
            _cache.move_to_end(key)
            return _cache[key]
    problem = _static_check(helper_code, main_code, entry_point)
    if problem is not None:
        outcome = Outcome(SCORE_INVALID, "invalid", False, problem)
    else:
        program = build_program(context or "", helper_code, main_code, test, entry_point)
        if not _compiles(program.code):
            outcome = Outcome(SCORE_INVALID, "invalid", False, "The combined program is not valid Python.")
        else:
            result = run_python(
                program.code, timeout_s=SETTINGS.timeout_s, memory_mb=SETTINGS.memory_mb,
                file_size_mb=SETTINGS.file_size_mb, backend=SETTINGS.backend,
            )  # fmt: skip
            score, level, message = _classify(program, result, entry_point)
            cooperates = calls_helper(main_code, entry_point)
            outcome = Outcome(score + (BONUS_CALLS_HELPER if cooperates else 0.0), level, cooperates, message, result)
    if outcome.sandbox is not None and outcome.sandbox.status == "error":
        return outcome  # a set-up problem, not the agents' doing: not cached
    with _cache_lock:
        _cache[key] = outcome
        while len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    return outcome


def _workers() -> int:
    return SETTINGS.workers or min(4, os.cpu_count() or 1)


def code_reward(completions1, completions2, test, entry_point, context=None, **kwargs) -> list[float]:
    """Joint reward: run each (helper, entry point) pair with the problem's tests in the sandbox. See REWARD_LEVELS."""
    contexts = context if context is not None else [""] * len(completions1)
    jobs = list(zip(completions1, completions2, test, entry_point, contexts, strict=True))
    with ThreadPoolExecutor(max_workers=_workers()) as pool:
        outcomes = list(pool.map(lambda job: evaluate(*job), jobs))
    return [o.reward for o in outcomes]


# ---------------------------------------------------------------------------------------------------------- feedback


def _block(code: str, limit: int = 1500) -> str:
    code = code.rstrip()
    if len(code) > limit:
        code = code[:limit] + "\n# ... (cut)"
    return f"```python\n{code}\n```"


def feedback_text(agent: int, helper_code: str, main_code: str, entry_point: str, outcome: Outcome) -> str:
    """What agent `agent` (0: helper, 1: entry point) is told about the last joint answer."""
    mine, theirs = (helper_code, main_code) if agent == 0 else (main_code, helper_code)
    my_function, their_function = (HELPER_NAME, entry_point) if agent == 0 else (entry_point, HELPER_NAME)
    other = 2 if agent == 0 else 1
    cooperation = (
        f"`{entry_point}` calls `{HELPER_NAME}`."
        if outcome.calls_helper
        else f"`{entry_point}` does not call `{HELPER_NAME}`."
    )
    return (
        f"Your last `{my_function}`:\n{_block(mine)}\n"
        f"Agent {other}'s last `{their_function}`:\n{_block(theirs)}\n"
        f"Result: {outcome.message} {cooperation}\n\n"
        f"Write an improved `{my_function}` in one ```python code block."
    )


def code_feedback(prompt, agent_completions, num_agents, **history) -> list:
    """Turn transition: tell each agent how the last joint answer did (the failing test and call, or the error)."""
    if num_agents != 2:
        raise ValueError(
            f"code_feedback: this recipe has 2 agents (helper, entry point), got num_agents={num_agents}."
        )
    missing = [k for k in ("entry_point", "test") if k not in history]
    if missing:
        raise ValueError(f"code_feedback needs the dataset columns {missing} (HumanEval rows from build_dataset()).")
    entry_point, test = history["entry_point"], history["test"]
    context = history.get("context") or ""
    helper, main = agent_completions
    outcome = evaluate(helper, main, test, entry_point, context)
    codes = (extract_code(helper, HELPER_NAME), extract_code(main, entry_point))
    row = {"prompt": prompt, "entry_point": entry_point}
    past = history.get("prompt_history_per_agent") or [[], []]
    prompts = []
    for agent, first in enumerate((helper_text(row), main_text(row))):
        text = feedback_text(agent, *codes, entry_point, outcome)
        last = past[agent][-1] if past[agent] else None
        if isinstance(last, list):  # chat: the conversation goes on
            prompts.append([*last, {"role": "assistant", "content": agent_completions[agent]},
                            {"role": "user", "content": text}])  # fmt: skip
        else:  # plain text: the task, the last attempt and its result, and an opened code block
            prompts.append(f"{first}\n\n{text}{_OPEN_BLOCK}")
    return prompts
