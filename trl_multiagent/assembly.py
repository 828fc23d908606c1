"""From the trainer's arguments to an `AgentTeam`: agents or one model for all, tokenizers, LoRA, frozen agents.

`plan_team` checks the arguments without loading anything, so that mistakes surface before expensive work;
`build_team` loads the models and assembles the team.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from .team import AgentTeam


class _Copy:
    """An agent to be built as a copy of an in-memory model, once the other checks have passed."""

    def __init__(self, model):
        self.model = model


@dataclass
class TeamPlan:
    specs: list  # per model to load: a model, a model id or a `_Copy`
    num_agents: int
    tokenizers: list | None  # one per agent, or None to load each model's own
    peft_configs: list | None  # one per agent
    shared_base: bool  # one base model, one adapter per agent
    trainable: list[int]


@dataclass
class BuiltTeam:
    team: AgentTeam
    tokenizers: list
    eos_token_ids: list[list[int]]  # per agent, every id that ends a completion


def plan_team(agents, model, num_agents, tokenizer, peft_config, trainable_agents) -> TeamPlan:
    specs = _agent_specs(agents, model, num_agents)
    n = len(specs)
    peft_configs = _peft_config_list(peft_config, n)
    trainable = list(range(n)) if trainable_agents is None else list(trainable_agents)
    if any(not 0 <= i < n for i in trainable):
        raise ValueError(f"MAGRPOConfig.trainable_agents={trainable} names agents outside 0..{n - 1}.")
    shared_base = peft_configs is not None and model is not None
    if shared_base and any(getattr(c, "modules_to_save", None) for c in peft_configs):
        raise ValueError(
            "MAGRPOTrainer: a shared-base LoRA team cannot train `modules_to_save` (got "
            f"{[getattr(c, 'modules_to_save', None) for c in peft_configs]}): those modules are copies outside the "
            "LoRA layers, and acting as one agent would leave them on another's. Remove `modules_to_save`, or give "
            "each agent its own base (`agents=[model_a, model_b]`)."
        )
    return TeamPlan(
        specs=specs[:1] if shared_base else specs,  # a shared base is loaded once; the agents are its adapters
        num_agents=n,
        tokenizers=_tokenizer_list(tokenizer, n),
        peft_configs=peft_configs,
        shared_base=shared_base,
        trainable=trainable,
    )


def build_team(plan: TeamPlan, model_init_kwargs: dict | None = None) -> BuiltTeam:
    models = [_load_agent(spec, model_init_kwargs) for spec in plan.specs]
    owner = [models[0] if plan.shared_base else models[i] for i in range(plan.num_agents)]  # the model of each agent
    tokenizers = plan.tokenizers or [AutoTokenizer.from_pretrained(m.config._name_or_path) for m in owner]
    eos_token_ids = [_prepare_tokenizer_and_model(t, m) for t, m in zip(tokenizers, owner)]
    team = _assemble(models, plan.peft_configs, plan.shared_base)
    for i in range(plan.num_agents):
        if i not in plan.trainable:
            for p in team.agent_parameters(i):
                p.requires_grad_(False)
    return BuiltTeam(team, tokenizers, eos_token_ids)


def _agent_specs(agents, model, num_agents) -> list:
    if agents is not None and model is not None:
        raise ValueError("MAGRPOTrainer: pass `agents=[...]` or `model=` with `num_agents=`, not both.")
    if agents is not None:
        if num_agents is not None and num_agents != len(agents):
            raise ValueError(f"MAGRPOTrainer: num_agents={num_agents} but {len(agents)} agents were given.")
        specs = list(agents)
    elif model is not None:
        if num_agents is None:
            raise ValueError("MAGRPOTrainer: `model=` needs `num_agents=` (or pass `agents=[...]`).")
        # Homogeneous agents start from the same weights but train separately.
        specs = [model] + [model if isinstance(model, str) else _Copy(model) for _ in range(num_agents - 1)]
    else:
        raise ValueError("MAGRPOTrainer needs `agents=[model, ...]` or `model=` with `num_agents=`.")
    if not specs:
        raise ValueError("MAGRPOTrainer: `agents` is empty.")
    return specs


def _peft_config_list(peft_config, num_agents: int) -> list | None:
    if peft_config is None:
        return None
    configs = list(peft_config) if isinstance(peft_config, (list, tuple)) else [peft_config] * num_agents
    if len(configs) != num_agents:
        raise ValueError(
            f"MAGRPOTrainer got {len(configs)} peft_configs for {num_agents} agents; pass one or one each."
        )
    return configs


def _assemble(models: list, peft_configs: list | None, shared_base: bool) -> AgentTeam:
    """Separate models (optionally each wrapped with its own adapter), or one base with an adapter per agent."""
    if peft_configs is None:
        return AgentTeam(models)
    from peft import get_peft_model

    if not shared_base:
        return AgentTeam([get_peft_model(m, c) for m, c in zip(models, peft_configs)])
    names = [f"agent_{i}" for i in range(len(peft_configs))]
    peft_model = get_peft_model(models[0], peft_configs[0], adapter_name=names[0])
    for name, config in zip(names[1:], peft_configs[1:]):
        peft_model.add_adapter(name, config)
    # Every adapter trains at once; PEFT leaves only the active one trainable.
    for param_name, param in peft_model.named_parameters():
        if any(f".{name}." in param_name for name in names):
            param.requires_grad_(True)
    return AgentTeam.shared_base(peft_model, names)


def _load_agent(spec, model_init_kwargs: dict | None) -> torch.nn.Module:
    if isinstance(spec, _Copy):
        return copy.deepcopy(spec.model)
    if isinstance(spec, str):
        return AutoModelForCausalLM.from_pretrained(spec, **(model_init_kwargs or {}))
    if isinstance(spec, torch.nn.Module):
        return spec
    raise TypeError(f"MAGRPOTrainer: an agent must be a model or a model id, got {type(spec).__name__}.")


def _tokenizer_list(tokenizer, num_agents: int) -> list | None:
    if tokenizer is None:
        return None
    if isinstance(tokenizer, (list, tuple)):
        if len(tokenizer) != num_agents:
            raise ValueError(
                f"MAGRPOTrainer got {len(tokenizer)} tokenizers for {num_agents} agents; pass one tokenizer for all "
                "agents or exactly one per agent."
            )
        return list(tokenizer)
    return [tokenizer] * num_agents


def _prepare_tokenizer_and_model(tokenizer, model) -> list[int]:
    """Give the tokenizer a pad token, mirror it on the model, and return every id that ends a completion."""
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.config.get_text_config().pad_token_id = tokenizer.pad_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    eos = model.generation_config.eos_token_id
    eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    return eos if tokenizer.eos_token_id in eos else [tokenizer.eos_token_id, *eos]
