"""`AgentTeam`: the N policies as one module, so that one optimizer and one accelerate/DeepSpeed engine hold them all.

The Trainer (and DDP/DeepSpeed) see a single model. Every forward goes through the team, which routes it to the agent
selected with `acting(i)`: DDP and ZeRO hooks stay on the path, and each agent keeps its own architecture, vocabulary
and generation config.

Two layouts:

- separate models (`AgentTeam(agents)`): full models or PEFT models, each with its own weights;
- one shared base with one LoRA adapter per agent (`AgentTeam.shared_base(peft_model, adapter_names)`): N agents at
  about the cost of one base model. Acting as agent i activates adapter i in every LoRA layer *without* touching
  `requires_grad` (PEFT's `set_adapter` would freeze the others), so every adapter trains in the same step.
"""

from __future__ import annotations

import contextlib
import os
from contextlib import contextmanager

from torch import nn


# GRPOTrainer's name for the frozen copy of an adapter that arrived trained (`AgentTeam.copy_pretrained_adapters`)
REFERENCE_ADAPTER = "ref"


def _adapter_layers(model: nn.Module) -> list[nn.Module]:
    """The modules of PEFT `model` that hold an active adapter: its tuner layers (LoRA's, ...) and the wrappers of
    `modules_to_save` and trainable tokens."""
    from peft.tuners.tuners_utils import BaseTunerLayer
    from peft.utils.other import AuxiliaryTrainingWrapper

    return [m for m in model.modules() if isinstance(m, (BaseTunerLayer, AuxiliaryTrainingWrapper))]


def _point_adapters(model: nn.Module, layers: list[nn.Module], name: str) -> None:
    """Make adapter `name` the one that runs in every layer of PEFT `model`, without touching `requires_grad` (PEFT's
    `set_adapter` would freeze the others and unfreeze this one). Each layer keeps the form it holds the name in (a
    list; a string in a `modules_to_save` wrapper)."""
    for layer in layers:
        layer._active_adapter = name if isinstance(layer._active_adapter, str) else [name]
    model.base_model.active_adapter = name


def _add_adapter_copy(model: nn.Module, source: str, name: str) -> list[tuple[nn.Parameter, nn.Parameter]]:
    """Add adapter `name` to PEFT `model`, a frozen copy of adapter `source` (its LoRA weights and `modules_to_save`
    copies); which parameters train and which adapter runs stay as they were. Returns the (source, copy) parameter
    pairs."""
    trainable = {key: p.requires_grad for key, p in model.named_parameters()}
    model.add_adapter(name, model.peft_config[source])
    parameters = dict(model.named_parameters())
    pairs = []
    for key in [k for k in trainable if f".{source}." in k]:
        copy = parameters[key.replace(f".{source}.", f".{name}.")]
        copy.data.copy_(parameters[key].data)
        pairs.append((parameters[key], copy))
    for key, p in parameters.items():  # PEFT's `add_adapter` changes which adapters train; put that back
        p.requires_grad_(trainable.get(key, False))
    return pairs


def _is_peft(module: nn.Module) -> bool:
    try:
        from peft import PeftModel
    except ImportError:
        return False
    return isinstance(module, PeftModel)


class AgentTeam(nn.Module):
    """The N agents of a team as one module: the model `MAGRPOTrainer` gives Trainer (`trainer.team`).

    One optimizer, one DDP/DeepSpeed engine and one checkpointing switch cover every agent. A forward runs the active
    agent: `with team.acting(i) as agent:` routes forwards to agent `i` (on a shared base, activates its adapter) and
    yields the module to call. The trainer generates and computes log-probs one agent at a time this way, and runs an
    update chunk's losses of all agents in one call of the wrapped team (`forward(run=...)`). `AgentTeam(agents)`
    holds separate models; `AgentTeam.shared_base(peft_model, adapter_names)`, one LoRA adapter per agent on one base.
    """

    def __init__(self, agents: list[nn.Module], adapter_names: list[str] | None = None):
        super().__init__()
        if not agents:
            raise ValueError("AgentTeam needs at least one agent.")
        self.agents = nn.ModuleList(agents)
        self.adapter_names = list(adapter_names) if adapter_names else None
        self.reference_adapter_names: list[str] | None = None  # `add_reference_adapters`
        self.adapters_from_config = False  # the adapters were made from `peft_config` (`team.assembly`), fresh
        self.active = 0
        if self.adapter_names:
            self._tuner_layers = _adapter_layers(agents[0])
            self._activate(0)

    @classmethod
    def shared_base(cls, peft_model: nn.Module, adapter_names: list[str]) -> AgentTeam:
        """One PEFT model whose adapters `adapter_names[i]` are the agents."""
        return cls([peft_model], adapter_names)

    @property
    def num_agents(self) -> int:
        return len(self.adapter_names) if self.adapter_names else len(self.agents)

    def __len__(self) -> int:
        return self.num_agents

    @property
    def is_shared_base(self) -> bool:
        return self.adapter_names is not None

    @property
    def all_adapters(self) -> bool:
        """Every agent is an adapter (shared base, or one PEFT model each): its reference is on the agent itself (the
        adapter disabled, or a frozen copy of it: `reference`), not a copy of the team."""
        return self.is_shared_base or all(_is_peft(a) for a in self.agents)

    def adapter_name(self, index: int) -> str:
        """The PEFT adapter that is agent `index` (`agent_{i}` on a shared base, else its model's active one, PEFT's
        "default" unless the model came with another): the one saved, served to vLLM and loaded on resume."""
        return self.adapter_names[index] if self.is_shared_base else self.agent(index).active_adapter

    def agent(self, index: int) -> nn.Module:
        """The module that acts for agent `index` (the shared PEFT model, or the agent's own model)."""
        return self.agents[0] if self.is_shared_base else self.agents[index]

    def agent_parameters(self, index: int) -> list[nn.Parameter]:
        """The parameters that belong to agent `index` alone (its adapter, on a shared base)."""
        if not self.is_shared_base:
            return list(self.agents[index].parameters())
        tag = f".{self.adapter_names[index]}."
        return [p for name, p in self.agents[0].named_parameters() if tag in name]

    def _activate(self, index: int, reference: bool = False) -> None:
        if self.is_shared_base:
            name = (self.reference_adapter_names if reference else self.adapter_names)[index]
            _point_adapters(self.agents[0], self._tuner_layers, name)
        self.active = index

    @contextmanager
    def acting(self, index: int):
        """Route forwards to agent `index` inside the block; yields the module to call (e.g. `generate` on)."""
        previous = self.active
        self._activate(index)
        try:
            yield self.agent(index)
        finally:
            self._activate(previous)

    @contextmanager
    def reference(self, index: int):
        """The frozen reference policy of adapter agent `index`: its adapter disabled; or, where the team has them, its
        reference adapter on a shared base (`add_reference_adapters`) or the frozen copy of its pretrained adapter
        (`copy_pretrained_adapters`)."""
        if self.is_shared_base and self.reference_adapter_names is not None:
            previous = self.active
            self._activate(index, reference=True)
            try:
                yield self.agent(index)
            finally:
                self._activate(previous)
            return
        with self.acting(index) as module:
            if self.is_shared_base or REFERENCE_ADAPTER not in module.peft_config:
                with module.disable_adapter():
                    yield module
                return
            layers = _adapter_layers(module)
            routed = [(layer, layer._active_adapter) for layer in layers], module.base_model.active_adapter
            _point_adapters(module, layers, REFERENCE_ADAPTER)
            try:
                yield module
            finally:
                for layer, name in routed[0]:
                    layer._active_adapter = name
                module.base_model.active_adapter = routed[1]

    def copy_pretrained_adapters(self) -> None:
        """Give each agent that is a PEFT model of its own a frozen copy of its adapter, named "ref" as GRPOTrainer
        names it, which `reference` runs: an adapter that arrived trained (SFT, then RL) is its own reference, so that
        the KL starts at 0 and pulls toward it rather than toward the base. For the KL term only: which parameters
        train, what is saved, served to vLLM or loaded on resume stay the agent's own adapter's
        (`adapter_name`)."""
        for i, agent in enumerate(self.agents):
            _add_adapter_copy(agent, self.adapter_name(i), REFERENCE_ADAPTER)

    def add_reference_adapters(self) -> list[tuple[nn.Parameter, nn.Parameter]]:
        """Give each agent of a shared base a frozen copy of its adapter, `reference_{name}`, which `reference` runs
        in place of the bare base: a reference that can be moved toward the policy (`sync_ref_model`). Returns the
        (policy, reference) parameter pairs, every agent's."""
        if not self.is_shared_base:
            raise ValueError(
                "MAGRPOConfig: sync_ref_model=True with agents that are PEFT models of their own is not supported, as "
                "GRPOTrainer does not support it with a PEFT model: their reference (the adapter disabled, or a frozen "
                "copy of an adapter that arrived trained) is not synced. Give one model with `num_agents` and "
                "`peft_config` (one shared base, one adapter per agent), full models, or sync_ref_model=False."
            )
        model = self.agents[0]
        self.reference_adapter_names = [f"reference_{name}" for name in self.adapter_names]
        pairs = []
        for name, reference in zip(self.adapter_names, self.reference_adapter_names, strict=True):
            pairs += _add_adapter_copy(model, name, reference)
        self._tuner_layers = _adapter_layers(model)
        self._activate(self.active)
        return pairs

    @property
    def trainer_model(self) -> nn.Module:
        """The model the Trainer holds (`trainer.model`): for a team of one, that agent's own model, as GRPOTrainer's
        (TRL code reads its parameter names, `lm_head`, class and PEFT attributes); for several, the team."""
        return self.agents[0] if self.num_agents == 1 else self

    def in_one_forward(self, wrapped: nn.Module, run):
        """`run(module)` inside one call of `wrapped` (the Trainer's model, as DDP or DeepSpeed wrap it), where
        `module`'s forward is the acting agent's: the wrapper sees exactly one forward per backward, as it requires.
        A team of one is the Trainer's model itself (`trainer_model`): `run` calls its wrapper directly."""
        return run(wrapped) if self.trainer_model is not self else wrapped(run=run)

    def forward(self, *args, run=None, **kwargs):
        """The active agent's forward; or, with `run=fn`, `fn(self)` (`in_one_forward`)."""
        if run is not None:
            return run(self)
        return self.agent(self.active)(*args, **kwargs)

    def generate(self, *args, **kwargs):
        """The acting agent's `generate` (`acting`): `trainer.model.generate`, as on GRPOTrainer's model. The
        transformers backend generates through it, so a `generate` patched on the team (as TRL's tests patch
        `trainer.model.generate`) is the one that runs."""
        return self.agent(self.active).generate(*args, **kwargs)

    @property
    def peft_config(self) -> dict:
        """The PEFT configs of the agents' adapters, by adapter name (PeftModel's `peft_config`): `{"default": ...}`
        for one adapter agent, one entry per agent (`agent_{i}`) on a shared base. No attribute without adapters."""
        configs = {}
        for agent in self.agents:
            configs.update(getattr(agent, "peft_config", {}))
        if not configs:
            raise AttributeError("AgentTeam.peft_config: no agent of this team is a PEFT model.")
        return configs

    def save_pretrained(self, save_directory: str, **kwargs) -> None:
        """One agent: its own `save_pretrained` into `save_directory`, as GRPOTrainer's model; several:
        `save_directory/agent_{i}/` each (the layout of `trainer.save_model`; a shared base writes each adapter). An
        adapter agent writes its own adapter, not the frozen reference copy beside it (`copy_pretrained_adapters`)."""
        if self.num_agents == 1:
            self.agent(0).save_pretrained(save_directory, **self._own_adapter(0, kwargs))
            return
        for i in range(self.num_agents):
            if self.is_shared_base:  # PEFT writes a named adapter into `<dir>/<name>/`
                self.agents[0].save_pretrained(save_directory, selected_adapters=[self.adapter_names[i]], **kwargs)
            else:
                self.agents[i].save_pretrained(
                    os.path.join(save_directory, f"agent_{i}"), **self._own_adapter(i, kwargs)
                )

    def _own_adapter(self, index: int, kwargs: dict) -> dict:
        """`save_pretrained`'s keywords for agent `index`: its own adapter selected, unless the caller chose."""
        if not _is_peft(self.agent(index)) or "selected_adapters" in kwargs:
            return kwargs
        return {**kwargs, "selected_adapters": [self.adapter_name(index)]}

    # What Trainer and GRPOTrainer read from "the model". `config` and `generation_config` are the first agent's: they
    # only serve code that expects one (model card, DeepSpeed bucket sizes); per-agent settings are read from each agent.
    @property
    def config(self):
        return self.agents[0].config

    @property
    def generation_config(self):
        return self.agents[0].generation_config

    # Activation checkpointing is switched on and off for every agent together. The team answers to transformers'
    # new names and its legacy ones (which TRL calls), and calls each agent by the new names where it has them: in
    # 5.24 the legacy ones warn, and 5.19 has only those.
    @property
    def is_activation_checkpointing(self) -> bool:
        return any(
            a.is_activation_checkpointing
            if hasattr(a, "is_activation_checkpointing")
            else getattr(a, "is_gradient_checkpointing", False)
            for a in self.agents
        )

    is_gradient_checkpointing = is_activation_checkpointing

    def _checkpoint_kwargs(self, kwargs: dict | None) -> dict | None:
        if not self.is_shared_base:
            return kwargs
        # A checkpointed layer recomputes its forward during backward, when another agent's adapter may be active.
        # The recompute context puts back the adapter that was active when the layer first ran.
        return {**(kwargs or {}), "use_reentrant": False, "context_fn": self._adapter_recompute_context}

    def _adapter_recompute_context(self):
        recorded = self.active

        @contextmanager
        def recompute():
            previous = self.active
            self._activate(recorded)
            try:
                yield
            finally:
                self._activate(previous)

        return contextlib.nullcontext(), recompute()

    def activation_checkpointing_enable(self, activation_checkpointing_kwargs=None, **kwargs):
        kwargs["activation_checkpointing_kwargs"] = self._checkpoint_kwargs(activation_checkpointing_kwargs)
        for agent in self.agents:
            if hasattr(agent, "activation_checkpointing_enable"):
                agent.activation_checkpointing_enable(**kwargs)
            else:  # transformers < 5.20 has only the legacy name
                agent.gradient_checkpointing_enable(
                    gradient_checkpointing_kwargs=kwargs["activation_checkpointing_kwargs"]
                )

    def activation_checkpointing_disable(self):
        for agent in self.agents:
            getattr(agent, "activation_checkpointing_disable", agent.gradient_checkpointing_disable)()

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None, **kwargs):
        self.activation_checkpointing_enable(gradient_checkpointing_kwargs, **kwargs)

    def gradient_checkpointing_disable(self):
        self.activation_checkpointing_disable()

    def add_model_tags(self, tags):
        for agent in self.agents:
            if hasattr(agent, "add_model_tags"):
                agent.add_model_tags(tags)
