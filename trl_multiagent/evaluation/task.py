"""The task a team is evaluated on: its joint reward, its transition between turns, its held-out prompts and their
format, named by flags (`--reward`, `--transition`, `--prompts`, `--prompt_format`) or, for what the flags leave
out, by the run folder's `evaluation_task.json`, which a training script writes next to its agents
(`write_task_file`; `recipes/length_ratio.py` writes the main job's):

    {"reward": "module:function", "transition": "module:function" or null,
     "prompts": "module:attribute" or "held_out.jsonl", "prompt_format": "chat",
     "initial_models": ["hub/id-or-folder", ...]}

`reward` and `prompts` are required; `transition` is needed for more than one turn; `prompt_format` ("auto", "chat"
or "plain") defaults to "auto"; `initial_models` (optional) are the models training started from, one per agent: the
untrained row of a full-weight team. A relative `.jsonl` path is read from the run folder. The functions and prompts
are imported when the command runs, so that the core names no task of its own; `check_task` checks everything else
first, since importing a module runs its top-level code.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import EvaluationError


TASK_FILE = "evaluation_task.json"
PROMPT_FORMATS = ("auto", "chat", "plain")
TASK_EXAMPLE = (
    '{"reward": "module:function", "transition": "module:function" or null, '
    '"prompts": "module:attribute" or "FILE.jsonl", "prompt_format": "chat", "initial_models": [...] (optional)}'
)
TASK_KEYS = ("reward", "transition", "prompts", "prompt_format", "initial_models")


def parse_spec(spec: str, flag: str) -> tuple[str, str]:
    """`module:attribute` split in two (dots allowed in both), naming `flag` on a bad spec; imports nothing."""
    if not isinstance(spec, str) or spec.count(":") != 1 or not all(spec.split(":")):
        raise EvaluationError(
            f"{flag} {spec!r}: expected `module:attribute` (e.g. `my_task:reward`, with my_task.py importable from "
            "the current folder or installed)."
        )
    module_name, attribute = spec.split(":")
    return module_name, attribute


def load_object(spec: str, flag: str) -> Any:
    """`module:attribute` imported (the module's top-level code runs), naming `flag` on a bad spec."""
    module_name, attribute = parse_spec(spec, flag)
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())  # `python -m` puts the current folder first; a plain interpreter may not
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise EvaluationError(f"{flag} {spec!r}: cannot import module {module_name!r}: {err}") from err
    target = module
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise EvaluationError(f"{flag} {spec!r}: module {module_name!r} has no attribute {attribute!r}.")
        target = getattr(target, part)
    return target


def load_callable(spec: str | Callable, flag: str) -> Callable:
    if callable(spec):
        return spec
    found = load_object(spec, flag)
    if not callable(found):
        raise EvaluationError(f"{flag} {spec!r} is a {type(found).__name__}, not a function.")
    return found


def load_prompts(spec: str | Sequence, flag: str = "--prompts") -> list:
    """Prompts from a list, a `module:attribute` list, or a `.jsonl` file (each line a string, or an object with a
    'prompt': text or chat messages)."""
    if not isinstance(spec, str):
        prompts = list(spec)
    elif spec.endswith(".jsonl"):
        if not os.path.isfile(spec):
            raise EvaluationError(f"{flag} {spec!r}: no such file.")
        prompts = []
        with open(spec) as file:
            for number, line in enumerate(file, 1):
                if line.strip():
                    try:
                        item = json.loads(line)
                    except json.JSONDecodeError as err:
                        raise EvaluationError(f"{flag} {spec!r}, line {number}: not JSON ({err}).") from err
                    if isinstance(item, dict) and "prompt" not in item:
                        raise EvaluationError(f"{flag} {spec!r}, line {number}: an object without a 'prompt' key.")
                    prompts.append(item["prompt"] if isinstance(item, dict) else item)
    else:
        found = load_object(spec, flag)
        if isinstance(found, str) or not isinstance(found, Sequence):
            raise EvaluationError(f"{flag} {spec!r} is a {type(found).__name__}, not a list of prompts.")
        prompts = list(found)
    if not prompts:
        raise EvaluationError(f"{flag} {spec!r}: no prompts.")
    for prompt in prompts:
        if not (isinstance(prompt, str) or (isinstance(prompt, list) and all(isinstance(m, dict) for m in prompt))):
            raise EvaluationError(
                f"{flag} {spec!r}: each prompt must be a string or a list of chat messages, got {prompt!r:.80}."
            )
    return prompts


def joint_reward_arity(func: Callable) -> int | None:
    """How many agents a joint reward scores (its positional lists of completions), or None when any count works (a
    TRL per-agent reward `f(completions, **kwargs)`, one list of lists, `*args`)."""
    import inspect

    try:
        parameters = list(inspect.signature(func).parameters.values())
    except (TypeError, ValueError):
        return None
    kinds = inspect.Parameter
    if any(p.kind == kinds.VAR_POSITIONAL for p in parameters):
        return None
    if any(p.kind == kinds.VAR_KEYWORD for p in parameters) and any(
        p.name in ("completions", "completion_ids") for p in parameters
    ):
        return None
    positional = [
        p
        for p in parameters
        if p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    ]
    return None if len(positional) == 1 else len(positional)


@dataclass
class TaskSpec:
    """The task as named (`module:attribute` strings, a `.jsonl` path, or the objects themselves), before loading;
    `labels` names where each came from (`--reward`, or the task file and its key), for the error messages."""

    reward: str | Callable | None
    transition: str | Callable | None
    prompts: str | Sequence | None
    prompt_format: str
    file: str | None = None  # the task file, when any part came from it
    labels: dict[str, str] = field(default_factory=dict)
    initial_models: list[str] | None = None  # per agent, the model its training started from

    def label(self, key: str) -> str:
        return self.labels.get(key, f"--{key}")


def read_task_file(folder: str) -> dict | None:
    """`folder/evaluation_task.json` as a dict of specs (a relative `.jsonl` path made relative to `folder`), or None
    when there is none."""
    path = os.path.join(folder, TASK_FILE)
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as file:
            task = json.load(file)
    except json.JSONDecodeError as err:
        raise EvaluationError(f"{path!r}: not JSON ({err}).") from err
    if not isinstance(task, dict):
        raise EvaluationError(f"{path!r}: expected a JSON object like {TASK_EXAMPLE}.")
    unknown = sorted(set(task) - set(TASK_KEYS))
    if unknown:
        raise EvaluationError(f"{path!r}: unknown keys {unknown}; the keys are those of {TASK_EXAMPLE}.")
    for key in ("reward", "transition", "prompts"):
        if task.get(key) is not None and not isinstance(task[key], str):
            raise EvaluationError(f"{path!r}: {key!r} must be a string (module:attribute), got {task[key]!r}.")
    if task.get("prompt_format") not in (None, *PROMPT_FORMATS):
        raise EvaluationError(f"{path!r}: 'prompt_format' must be auto, chat or plain, got {task['prompt_format']!r}.")
    models = task.get("initial_models")
    if models is not None and not (
        isinstance(models, list) and models and all(isinstance(m, str) and m for m in models)
    ):
        raise EvaluationError(f"{path!r}: 'initial_models' must be a list of model ids or folders, got {models!r}.")
    prompts = task.get("prompts")
    if isinstance(prompts, str) and prompts.endswith(".jsonl") and not os.path.isabs(prompts):
        task["prompts"] = os.path.join(folder, prompts)
    return task


def _is_spec(value) -> bool:
    return isinstance(value, str) and value.count(":") == 1 and all(value.split(":"))


def write_task_file(
    folder: str,
    *,
    reward: str,
    prompts: str,
    transition: str | None = None,
    prompt_format: str = "auto",
    initial_models: Sequence[str] | None = None,
) -> str:
    """Write `folder/evaluation_task.json`, the task `python -m trl_multiagent.evaluation folder` evaluates on without
    task flags: `reward` and `transition` as `module:function`, `prompts` as `module:attribute` or a `.jsonl` path
    (relative to `folder`), and `initial_models`, the model each agent's training started from (a Hub id or folder,
    as given: a prepared folder of the embedded model is not its Hub model, and is prepared again where it is
    missing, `saved_team.resolve_base`), for the untrained row of a full-weight team.
    A training script calls it next to `trainer.save_model(folder)`; returns the path."""
    for key, value in (("reward", reward), ("transition", transition), ("prompts", prompts)):
        valid = _is_spec(value) or (key == "transition" and value is None)
        valid = valid or (key == "prompts" and isinstance(value, str) and value.endswith(".jsonl"))
        if not valid:
            raise ValueError(
                f"write_task_file: {key} must be a `module:attribute` string"
                + (" or a .jsonl path" if key == "prompts" else "")
                + f", got {value!r}."
            )
    if prompt_format not in PROMPT_FORMATS:
        raise ValueError(f"write_task_file: prompt_format must be auto, chat or plain, got {prompt_format!r}.")
    task = {"reward": reward, "transition": transition, "prompts": prompts, "prompt_format": prompt_format}
    if initial_models is not None:
        if isinstance(initial_models, str) or not all(isinstance(m, str) and m for m in initial_models):
            raise ValueError(
                f"write_task_file: initial_models must be a list of model ids or folders, got {initial_models!r}."
            )
        task["initial_models"] = list(initial_models)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, TASK_FILE)
    with open(path, "w") as file:
        json.dump(task, file, indent=2)
        file.write("\n")
    return path


def resolve_task(
    folder: str,
    reward: str | Callable | None = None,
    transition: str | Callable | None = None,
    prompts: str | Sequence | None = None,
    prompt_format: str | None = None,
    initial_models: Sequence[str] | None = None,
) -> TaskSpec:
    """The task: each part from its flag when given, else from `folder/evaluation_task.json`. Without a reward or
    prompts from either, the error names both ways."""
    given = {
        "reward": reward,
        "transition": transition,
        "prompts": prompts,
        "prompt_format": prompt_format,
        "initial_models": initial_models,
    }
    task = read_task_file(folder)
    path = os.path.join(folder, TASK_FILE)
    labels, used_file = {}, False
    for key, value in given.items():
        if value is None and task is not None and task.get(key) is not None:
            given[key], labels[key], used_file = task[key], f"{path} {key!r}", True
    missing = [f"--{key}" for key in ("reward", "prompts") if given[key] is None]
    if missing:
        raise EvaluationError(
            f"OUTPUT_DIR {folder!r}: no task to evaluate on ({' and '.join(missing)} not given"
            + (f", nor in {path}" if task is not None else f", and no {path}")
            + "). Name it with flags: --reward module:function --prompts module:attribute (or a .jsonl file), and "
            "--transition module:function for more than one turn; or in that file, which the training script "
            f"writes next to its agents (`trl_multiagent.evaluation.write_task_file`; recipes/length_ratio.py "
            f"does): {TASK_EXAMPLE}."
        )
    return TaskSpec(
        given["reward"],
        given["transition"],
        given["prompts"],
        given["prompt_format"] or "auto",
        path if used_file else None,
        labels,
        list(given["initial_models"]) if given["initial_models"] is not None else None,
    )


def check_task(task: TaskSpec, folder: str, num_turns: int) -> None:
    """Everything about the task that needs no import, before any: each `module:attribute` spec's form, a `.jsonl`
    prompts file (read and checked whole), and a transition for more than one turn. Importing a `--reward` module
    runs its top-level code (a training script without a `__main__` guard trains), so a wrong argument must stop
    the command first."""
    for key in ("reward", "transition"):
        value = getattr(task, key)
        if isinstance(value, str):
            parse_spec(value, task.label(key))
    if isinstance(task.prompts, str):
        if task.prompts.endswith(".jsonl"):
            load_prompts(task.prompts, task.label("prompts"))
        else:
            parse_spec(task.prompts, task.label("prompts"))
    if num_turns > 1 and task.transition is None:
        raise EvaluationError(
            f"--num_turns {num_turns} needs --transition (module:function) to write the next turn's prompts "
            f'(or a "transition" in {os.path.join(folder, TASK_FILE)}).'
        )


def load_task(task: TaskSpec, tokenizer) -> tuple:
    """The callables and prompts of the run, text prompts as chat messages when `task.prompt_format` asks for it
    ("auto": when the tokenizer has a chat template)."""
    prompt_format = task.prompt_format
    chat = prompt_format == "chat" or (prompt_format == "auto" and getattr(tokenizer, "chat_template", None))
    reward = load_callable(task.reward, task.label("reward"))
    transition = load_callable(task.transition, task.label("transition")) if task.transition is not None else None
    prompts = load_prompts(task.prompts, task.label("prompts"))
    if chat:
        prompts = [[{"role": "user", "content": p}] if isinstance(p, str) else p for p in prompts]
    return reward, transition, prompts, bool(chat)


def spec_name(value) -> str:
    """How the report names a task part: its spec as given, or a function's name."""
    return value if isinstance(value, str) else getattr(value, "__qualname__", repr(value))
