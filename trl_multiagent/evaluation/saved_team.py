"""The saved team: `DIR/agent_{i}/` as `trainer.save_model` writes them (full weights or PEFT adapters), or one agent
saved into `DIR` itself (as GRPOTrainer saves its model); how to load them, the base each adapter loads on, and each
agent's tokenizer."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from ..checkpoint import agent_dir
from ..embedded_model import prepare_again
from ..prepared_models import resolve_model_id
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
    bases, resolved = [], {}  # each distinct base resolved once (and said once where it loads from a copy)
    for d in dirs:
        with open(os.path.join(d, "adapter_config.json")) as file:
            recorded = base_model or json.load(file).get("base_model_name_or_path")
        if recorded not in resolved:
            resolved[recorded] = resolve_base(recorded, d)
        bases.append(resolved[recorded])
    return SavedTeam(folder, "shared_lora" if len(set(bases)) == 1 else "lora", dirs, bases)


def _holds_model(folder: str) -> tuple[bool, bool]:
    """Whether `folder` holds a model's config.json, and an adapter's adapter_config.json."""
    return tuple(os.path.isfile(os.path.join(folder, name)) for name in ("config.json", "adapter_config.json"))


def resolve_base(base: str | None, adapter: str) -> str:
    """The folder (or Hub id) an adapter's base loads from: `base` when it is a folder here; a prepared folder that is
    missing here (the embedded model's, recorded by PEFT on the machine that trained it) prepared again here
    (`embedded_model.prepare_again`); a Hub id as `prepared_models.resolve_model_id` resolves it (offline: its
    prepared copy, said at WARNING as what it is)."""
    if not base:
        raise EvaluationError(f"{adapter!r}: adapter_config.json names no base model; pass --base_model.")
    if os.path.isdir(os.path.expanduser(base)):
        return os.path.expanduser(base)
    prepared = prepare_again(base, f"the base of {adapter!r}")
    if prepared is not None:
        return prepared
    try:
        return resolve_model_id(base, f"the base of {adapter!r}")
    except ValueError as error:
        raise EvaluationError(f"{error} Or pass --base_model.") from error


def tokenizer_for(team: SavedTeam, agent: int):
    """Agent `agent`'s tokenizer: from its folder when saved there (or a full model's folder), else from its base."""
    from transformers import AutoTokenizer

    folder = team.agent_dirs[agent]
    has_own = any(os.path.isfile(os.path.join(folder, name)) for name in ("tokenizer.json", "tokenizer_config.json"))
    source = folder if has_own or team.kind == "full" else team.bases[agent]
    return AutoTokenizer.from_pretrained(source)


def load_team(folder: str, base_model: str | None = None, **model_kwargs):
    """The team saved in `folder` by `trainer.save_model(folder)` (or a `checkpoint-N/` of its run), and each agent's
    tokenizer: returns `(team, tokenizers)`, `team` an `AgentTeam` whose `team.agent(i)` is agent i, in eval mode.

    Full weights load with `AutoModelForCausalLM`; adapters on one base load as the trainer built them, the base once
    with one adapter per agent (`AgentTeam.shared_base`), and adapters on different bases one base each. Each base is
    the one `adapter_config.json` records, or `base_model`, resolved as evaluation resolves it (`resolve_base`: a
    missing prepared folder of the embedded model is prepared again, a Hub id offline loads its prepared copy).
    `model_kwargs` go to every `from_pretrained` of a model (`dtype`, `device_map`, ...). The folder's `README.md`
    (`MAGRPOTrainer.create_model_card`) says the same.
    """
    from transformers import AutoModelForCausalLM

    from ..team.agent_team import AgentTeam

    saved = find_team(folder, base_model)
    tokenizers = [tokenizer_for(saved, i) for i in range(saved.num_agents)]
    if saved.kind == "full":
        team = AgentTeam([AutoModelForCausalLM.from_pretrained(d, **model_kwargs) for d in saved.agent_dirs])
        return team.eval(), tokenizers
    from peft import PeftModel

    if saved.kind == "shared_lora":  # as the trainer's shared-base team: adapters `agent_{i}` on one base
        names = [f"agent_{i}" for i in range(saved.num_agents)] if saved.num_agents > 1 else ["default"]
        base = AutoModelForCausalLM.from_pretrained(saved.bases[0], **model_kwargs)
        model = PeftModel.from_pretrained(base, saved.agent_dirs[0], adapter_name=names[0])
        for name, source in zip(names[1:], saved.agent_dirs[1:], strict=True):
            model.load_adapter(source, adapter_name=name)
        team = AgentTeam.shared_base(model, names) if saved.num_agents > 1 else AgentTeam([model])
        return team.eval(), tokenizers
    agents = [
        PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base, **model_kwargs), source)
        for base, source in zip(saved.bases, saved.agent_dirs, strict=True)
    ]
    return AgentTeam(agents).eval(), tokenizers
