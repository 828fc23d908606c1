"""The saved team: `DIR/agent_{i}/` as `trainer.save_model` writes them (full weights or PEFT adapters), or one agent
saved into `DIR` itself (as GRPOTrainer saves its model); how to load them, the base each adapter loads on, and each
agent's tokenizer."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from ..checkpoint import agent_dir
from ..prepared_models import find_prepared
from .errors import PROG, EvaluationError


@dataclass
class SavedTeam:
    """What `DIR/agent_{i}/` (or, for one agent, `DIR`) holds: `kind` is "full" (weights per agent), "shared_lora"
    (adapters on one base) or "lora" (adapters on different bases)."""

    folder: str
    kind: str
    agent_dirs: list[str]
    bases: list[str | None]  # per agent, the base an adapter loads on (None for full weights)

    @property
    def num_agents(self) -> int:
        return len(self.agent_dirs)


def find_team(folder: str, base_model: str | None = None) -> SavedTeam:
    """Read `folder`'s `agent_{i}/` folders (i = 0, 1, ... without gaps), or `folder` itself where one agent was saved
    there (`checkpoint.agent_dirs`), and decide how to load them."""
    if not os.path.isdir(folder):
        raise EvaluationError(
            f"OUTPUT_DIR {folder!r}: no such folder. Give the folder a training run saved its agents in (its "
            "`agent_0/`, `agent_1/`, ...), e.g. after the main job: "
            f"`{PROG} outputs/length_ratio`."
        )
    dirs = []
    while os.path.isdir(agent_dir(folder, len(dirs))):
        dirs.append(agent_dir(folder, len(dirs)))
    found = {os.path.basename(d) for d in dirs}
    others = sorted(n for n in os.listdir(folder) if n.startswith("agent_") and n not in found)
    if not dirs and not others and any(_holds_model(folder)):
        dirs = [folder]  # one agent, saved as GRPOTrainer saves its model
    if not dirs:
        raise EvaluationError(
            f"OUTPUT_DIR {folder!r} has no agent_0/ folder ({'found ' + str(others) if others else 'no agent_* folders'}"
            ") and holds no model of its own (config.json or adapter_config.json): give the folder "
            "`trainer.save_model(...)` or the recipe's `--output_dir` wrote the agents into (or one of its "
            "`checkpoint-N/` folders)."
        )
    if others:
        raise EvaluationError(
            f"OUTPUT_DIR {folder!r}: the agent folders must be numbered agent_0 .. agent_(N-1) without gaps; found "
            f"{[os.path.basename(d) for d in dirs]} and also {others}."
        )
    adapters = [_holds_model(d)[1] for d in dirs]
    if not any(adapters):
        for d in dirs:
            if not _holds_model(d)[0]:
                raise EvaluationError(
                    f"OUTPUT_DIR {folder!r}: {d!r} holds neither config.json nor adapter_config.json."
                )
        return SavedTeam(folder, "full", dirs, [None] * len(dirs))
    if not all(adapters):
        raise EvaluationError(
            f"OUTPUT_DIR {folder!r}: some agents are PEFT adapters and some full models "
            f"({[os.path.basename(d) for d, a in zip(dirs, adapters, strict=True) if a]} are adapters); evaluate a "
            "team saved by one run."
        )
    bases = []
    for d in dirs:
        with open(os.path.join(d, "adapter_config.json")) as file:
            recorded = json.load(file).get("base_model_name_or_path")
        bases.append(resolve_base(base_model or recorded, d))
    return SavedTeam(folder, "shared_lora" if len(set(bases)) == 1 else "lora", dirs, bases)


def _holds_model(folder: str) -> tuple[bool, bool]:
    """Whether `folder` holds a model's config.json, and an adapter's adapter_config.json."""
    return tuple(os.path.isfile(os.path.join(folder, name)) for name in ("config.json", "adapter_config.json"))


def resolve_base(base: str | None, adapter: str) -> str:
    """The folder (or Hub id) an adapter's base loads from: `base` when it is a folder here; its prepared folder
    (`prepared_models`: the embedded model's) when `base` is the Hub id of one; else `base` as it is (transformers' cache may hold it)."""
    if not base:
        raise EvaluationError(f"{adapter!r}: adapter_config.json names no base model; pass --base_model.")
    if os.path.isdir(os.path.expanduser(base)):
        return os.path.expanduser(base)
    return find_prepared(base) or base


def tokenizer_for(team: SavedTeam, agent: int):
    """Agent `agent`'s tokenizer: from its folder when saved there (or a full model's folder), else from its base."""
    from transformers import AutoTokenizer

    folder = team.agent_dirs[agent]
    has_own = any(os.path.isfile(os.path.join(folder, name)) for name in ("tokenizer.json", "tokenizer_config.json"))
    source = folder if has_own or team.kind == "full" else team.bases[agent]
    return AutoTokenizer.from_pretrained(source)
