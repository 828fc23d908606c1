"""From the trainer's arguments to an `AgentTeam`: agents or one model for all, tokenizers, LoRA, frozen agents.

`plan_team` checks the arguments without loading anything, so that mistakes surface before expensive work;
`load_tokenizers` loads (or takes) each agent's tokenizer, and `build_team` loads the models and assembles the team.
"""

from __future__ import annotations

import copy
import os
import warnings
from dataclasses import dataclass
from functools import partial
from typing import NamedTuple

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from transformers.utils import is_peft_available, logging

from ..prepared_models import resolve_model_id
from ..trl_release import require_fused_head_kernels
from .agent_team import AgentTeam
from .reference_sync import reference_sync


if is_peft_available():
    from peft.tuners.tuners_utils import BaseTunerLayer


logger = logging.get_logger(__name__)


class _Copy:
    """An agent to be built as a copy of an in-memory model, once the other checks have passed."""

    def __init__(self, model):
        self.model = model


@dataclass
class TeamPlan:
    specs: list  # per model to load: a model, a model id or a `_Copy`
    labels: list[str]  # per spec, the argument it came from (`model[1]`, `model`), for errors
    num_agents: int
    tokenizers: list | None  # one per agent, or None to load each model's own
    peft_configs: list | None  # one per agent
    shared_base: bool  # one base model, one adapter per agent
    trainable: list[int]


class BuiltTeam(NamedTuple):
    team: AgentTeam
    eos_token_ids: list[list[int]]  # per agent, every id that ends a completion


def plan_team(model, num_agents, tokenizer, peft_config, trainable_agents, configured_agents=None) -> TeamPlan:
    """What the team will be, checked before anything is loaded: `model=[a, b]` is one model per agent; one model is
    one agent, as in GRPOTrainer, or `num_agents` copies of it (`num_agents=`, else `MAGRPOConfig.num_agents`:
    `configured_agents`), which a list given must have too."""
    several = isinstance(model, (list, tuple))
    specs = _agent_specs(model, num_agents, configured_agents)
    n = len(specs)
    peft_configs = _peft_config_list(peft_config, n)
    labels = [f"model[{i}]" for i in range(n)] if several else ["model"] * n
    for spec, label in zip(specs, labels, strict=True):
        _check_spec(spec, label)
    trainable = _trainable_list(trainable_agents, n)
    if peft_configs is not None:
        _check_no_adapter_on_adapter(specs, labels)
    # Several agents copied from one model share its base, one adapter each; one agent is GRPOTrainer's PEFT model.
    shared_base = peft_configs is not None and not several and n > 1
    if shared_base and any(getattr(c, "modules_to_save", None) for c in peft_configs):
        raise ValueError(
            "MAGRPOTrainer: a shared-base LoRA team cannot train `modules_to_save` (got "
            f"{[getattr(c, 'modules_to_save', None) for c in peft_configs]}): those modules are copies outside the "
            "LoRA layers, and acting as one agent would leave them on another's. Remove `modules_to_save`, or give "
            "each agent its own base (`model=[model_a, model_b]`)."
        )
    return TeamPlan(
        specs=specs[:1] if shared_base else specs,  # a shared base is loaded once; the agents are its adapters
        labels=labels[:1] if shared_base else labels,
        num_agents=n,
        tokenizers=_tokenizer_list(tokenizer, n),
        peft_configs=peft_configs,
        shared_base=shared_base,
        trainable=trainable,
    )


def resolve_model_ids(plan: TeamPlan) -> None:
    """Each model id of the plan as it will load (`prepared_models.resolve_model_id`: a Hub id the Hub cannot serve
    here loads from its prepared copy, said once at WARNING, or fails at once naming the id), each id resolved once."""
    resolved = {}
    for i, (spec, label) in enumerate(zip(plan.specs, plan.labels, strict=True)):
        if isinstance(spec, str):
            if spec not in resolved:
                resolved[spec] = resolve_model_id(spec, f"MAGRPOTrainer: {label}")
            plan.specs[i] = resolved[spec]


def load_tokenizers(plan: TeamPlan, trust_remote_code: bool = False) -> list:
    """Each agent's tokenizer: the ones given, else its model's own, loaded before the (much larger) models."""
    if plan.tokenizers is not None:
        return plan.tokenizers
    resolve_model_ids(plan)  # a Hub id offline: its prepared copy, or a clear error now rather than after retries
    owners = [0 if plan.shared_base else i for i in range(plan.num_agents)]
    return [_tokenizer(plan.specs[o], plan.labels[o], trust_remote_code) for o in owners]


def build_team(
    plan: TeamPlan,
    tokenizers: list,
    model_init_kwargs: dict | None = None,
    resize_embeddings: bool = False,
    kl_reference: bool = False,
) -> BuiltTeam:
    """Load the agents and assemble the team. `resize_embeddings` grows each agent's embeddings to its tokenizer
    (tokens added to it, as CoMLRL's `model_config["special_tokens"]`), before any adapter wraps the model. With
    `kl_reference` (`beta != 0`), agents that arrived as PEFT models with their adapters get a frozen copy of it as
    their reference (`AgentTeam.copy_pretrained_adapters`), here, where GRPOTrainer adds its "ref" adapter: before the
    Trainer seeds, so that the copy's initialisation draws nothing from the run's random numbers."""
    resolve_model_ids(plan)  # the ids of agents given with their tokenizers are resolved here, as they load
    models = [_load_agent(spec, label, model_init_kwargs) for spec, label in zip(plan.specs, plan.labels, strict=True)]
    owner = [models[0] if plan.shared_base else models[i] for i in range(plan.num_agents)]  # the model of each agent
    if resize_embeddings:
        for tokenizer, model in zip(tokenizers, owner, strict=True):
            _resize_to(tokenizer, model)
    eos_token_ids = [_prepare_tokenizer_and_model(t, m) for t, m in zip(tokenizers, owner, strict=True)]
    team = _assemble(models, plan.peft_configs, plan.shared_base)
    for i in range(plan.num_agents):
        if i not in plan.trainable:
            for p in team.agent_parameters(i):
                p.requires_grad_(False)
    if kl_reference and team.all_adapters and not team.adapters_from_config:
        team.copy_pretrained_adapters()
    return BuiltTeam(team, eos_token_ids)


def fused_heads_on_agents(team: AgentTeam, temperature: float, cast_lm_head_to_fp32: bool = False) -> None:
    """GRPOTrainer patches its fused log-prob head (`trl.trainer.utils.add_fused_lm_head`) onto the model it is given,
    the team container, as a `forward` attribute; the head belongs on each agent, where the loss calls it. With
    `cast_lm_head_to_fp32`, each agent's LM head is cast first (`cast_lm_head_to_float32`), as GRPOTrainer casts its
    model's."""
    vars(team).pop("forward", None)  # GRPOTrainer's patch on the container, when the container is its model
    for i, agent in enumerate(team.agents):
        if is_peft_available() and isinstance(agent.get_output_embeddings(), BaseTunerLayer):
            # GRPOTrainer's check, which sees only the container: the log-probs read `lm_head.weight` directly
            raise ValueError(
                f"MAGRPOTrainer: agent {i}: Applying a PEFT adapter to `lm_head` is not supported: the log-probabilities "
                "are computed from `lm_head.weight` directly, so the adapter would never be trained. Remove "
                "`'lm_head'` from your `target_modules`."
            )
        if cast_lm_head_to_fp32:
            cast_lm_head_to_float32(_base(agent), f"agent {i}")
    add_fused_heads(team, temperature, cast_lm_head_to_fp32)


def add_fused_heads(team: AgentTeam, temperature: float, cast_lm_head_to_fp32: bool) -> None:
    """TRL's fused log-prob head on each agent, over the agent's own `forward`. The head keeps the forward it wraps
    in a closure, so a deep copy of a patched agent would still run the original's weights outside the fused path:
    a copy (the reference agents) drops the copied patch and gets a head of its own."""
    from accelerate import PartialState
    from trl.trainer.utils import add_fused_lm_head

    require_fused_head_kernels(PartialState().device.type)
    for agent in team.agents:
        base = _base(agent)
        base.__dict__.pop("forward", None)
        add_fused_lm_head(
            base, temperature=temperature, cast_lm_head_to_fp32=cast_lm_head_to_fp32, outputs=("log_probs", "entropy")
        )


def _base(agent):
    return agent.get_base_model() if hasattr(agent, "get_base_model") else agent


def cast_lm_head_to_float32(model, name: str) -> None:
    """GRPOConfig's `cast_lm_head_to_fp32` on one agent: its LM head's weights in float32 and its input cast to
    float32, so the logits are float32 in generation too (the fused log-prob head casts by itself). A tied embedding
    shares the float32 weight and keeps its output in the model's dtype. Done with hooks, not a patched `forward`, so
    that a deep copy (the reference agents) computes with its own weights."""
    head = model.get_output_embeddings()
    if is_peft_available() and isinstance(head, BaseTunerLayer):
        raise ValueError(
            f"MAGRPOConfig: `cast_lm_head_to_fp32=True` is not supported when the lm_head carries a PEFT adapter "
            f"({name}: `target_modules` includes `lm_head`). Remove `lm_head` from the adapter's target modules, or "
            "set `cast_lm_head_to_fp32=False`."
        )
    dtype = head.weight.dtype
    head.float()
    head.register_forward_pre_hook(_inputs_to_float32)
    if getattr(model.config.get_text_config(), "tie_word_embeddings", False):
        model.get_input_embeddings().register_forward_hook(partial(_output_to, dtype))


def _inputs_to_float32(module, args):
    return tuple(a.float() if torch.is_tensor(a) and a.is_floating_point() else a for a in args)


def _output_to(dtype, module, args, output):
    return output.to(dtype)


def build_reference(accelerator, model, args, temperature: float) -> tuple[AgentTeam | None, TrainerCallback | None]:
    """The reference team for the KL term when `beta > 0`, and the callback that syncs it with `sync_ref_model`
    (`reference_sync`; else None).

    The reference team is a frozen copy of every agent of the prepared `model`, taken before training, with fused heads
    of its own; None without a KL term, and for adapter teams, whose reference is on each agent (`AgentTeam.
    reference`): the base, adapter disabled, for adapters made fresh from `peft_config`; for PEFT models that arrived
    with their adapters (trained, say, by SFT), the frozen copy of each adapter that `build_team` added, as
    GRPOTrainer adds its "ref" adapter.
    """
    team = accelerator.unwrap_model(model)
    reference = None
    if args.beta != 0.0 and not team.all_adapters:
        reference = _frozen_copy(accelerator, team, args, temperature)
    return reference, reference_sync(accelerator, team, reference) if args.sync_ref_model else None


def _frozen_copy(accelerator, team: AgentTeam, args, temperature: float):
    from trl.models.utils import prepare_deepspeed

    reference = copy.deepcopy(team)
    add_fused_heads(reference, temperature, args.cast_lm_head_to_fp32)
    reference.requires_grad_(False)
    reference.eval()
    if getattr(accelerator.state, "deepspeed_plugin", None) is not None:  # as `Trainer.is_deepspeed_enabled`
        return prepare_deepspeed(reference, accelerator)  # sharded like the policy under ZeRO-3
    return accelerator.prepare_model(reference, evaluation_mode=True)


def _agent_specs(model, num_agents, configured) -> list:
    if model is None:
        raise ValueError(
            "MAGRPOTrainer needs `model`: one model or id (one agent, or `num_agents` copies), or a list with one per "
            "agent."
        )
    if num_agents is not None and configured is not None and num_agents != configured:
        raise ValueError(f"MAGRPOTrainer: num_agents={num_agents}, but MAGRPOConfig(num_agents={configured}).")
    num_agents = num_agents if num_agents is not None else configured
    if isinstance(model, (list, tuple)):
        if not model:
            raise ValueError("MAGRPOTrainer: `model` is an empty list; give one model or id per agent.")
        if num_agents is not None and num_agents != len(model):
            raise ValueError(
                f"MAGRPOTrainer got {len(model)} models (one per agent), but num_agents={num_agents}; pass "
                f"{num_agents} models, or leave num_agents out (the team's size is the number of models given)."
            )
        return list(model)
    if num_agents is not None and num_agents < 1:
        raise ValueError(f"MAGRPOTrainer: num_agents must be >= 1, got {num_agents}.")
    # Homogeneous agents start from the same weights but train separately.
    copies = (num_agents or 1) - 1
    return [model] + [model if isinstance(model, str) else _Copy(model) for _ in range(copies)]


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
    from peft import get_peft_model as peft_get_peft_model

    def get_peft_model(model, config, **kwargs):
        # PEFT asks the model for `is_gradient_checkpointing`, which transformers 5.24 deprecates with a FutureWarning
        # the user can do nothing about (their setting is `activation_checkpointing`).
        with warnings.catch_warnings():
            warnings.filterwarnings(
                "ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning
            )
            return peft_get_peft_model(model, config, **kwargs)

    if not shared_base:
        team = AgentTeam([get_peft_model(m, c) for m, c in zip(models, peft_configs, strict=True)])
    else:
        names = [f"agent_{i}" for i in range(len(peft_configs))]
        peft_model = get_peft_model(models[0], peft_configs[0], adapter_name=names[0])
        for name, config in zip(names[1:], peft_configs[1:], strict=True):
            peft_model.add_adapter(name, config)
        # Every adapter trains at once; PEFT leaves only the active one trainable.
        for param_name, param in peft_model.named_parameters():
            if any(f".{name}." in param_name for name in names):
                param.requires_grad_(True)
        team = AgentTeam.shared_base(peft_model, names)
    team.adapters_from_config = True
    return team


def _trainable_list(trainable_agents, n: int) -> list[int]:
    trainable = list(range(n)) if trainable_agents is None else list(trainable_agents)
    if not trainable:
        # With no trainable parameter the loss is a plain float, and the first backward fails after a whole rollout.
        raise ValueError(
            "MAGRPOConfig.trainable_agents=[] trains no agent; at least one agent must train. Name the agents that "
            f"train (0..{n - 1}), or leave it None to train all. To only measure a team, build the trainer with "
            "`eval_dataset=` and call `trainer.evaluate()`, which changes no weight."
        )
    if any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n for i in trainable):
        raise ValueError(f"MAGRPOConfig.trainable_agents={trainable} names agents outside 0..{n - 1}.")
    repeated = sorted({i for i in trainable if trainable.count(i) > 1})
    if repeated:
        raise ValueError(
            f"MAGRPOConfig.trainable_agents={trainable} names agent(s) {repeated} more than once; name each agent "
            "that trains once."
        )
    return trainable


def _check_spec(spec, label: str) -> None:
    """A model, or a model id; an id meant as a folder that does not exist is said as such, not as a bad hub id."""
    if not isinstance(spec, (str, torch.nn.Module, _Copy)):
        raise TypeError(f"MAGRPOTrainer: {label} must be a model or a model id, got {type(spec).__name__}: {spec!r}.")
    if not isinstance(spec, str):
        return
    # A hub id is `name` or `namespace/name`; anything else can only be a folder.
    local = spec.startswith(("/", "./", "../", "~")) or spec.count("/") > 1 or (os.sep != "/" and os.sep in spec)
    if local and not os.path.exists(os.path.expanduser(spec)):
        raise FileNotFoundError(
            f"MAGRPOTrainer: {label} = {spec!r} could not be loaded: no such folder. Give the folder the model was "
            "saved in (`save_pretrained`), or a hub id such as 'HuggingFaceTB/SmolLM2-135M-Instruct'."
        )


def _check_no_adapter_on_adapter(specs: list, labels: list[str]) -> None:
    """`peft_config` with a model that is already a PEFT model is refused, as GRPOTrainer refuses it: a second adapter
    would wrap the first, which would go on acting, untrained, under it."""
    from peft import PeftModel

    for spec, label in zip(specs, labels, strict=True):
        if isinstance(spec.model if isinstance(spec, _Copy) else spec, PeftModel):
            raise ValueError(
                f"MAGRPOTrainer: {label} is a `PeftModel` and `peft_config` was given too, as GRPOTrainer refuses: "
                "the new adapter would wrap the one the model has. To train the adapter it has, leave `peft_config` "
                "out (with `beta != 0` its frozen copy is the reference); for a new adapter, first merge and unload "
                "the existing one (`merge_and_unload()`), and pass that base model with `peft_config`."
            )


def _from_pretrained(load, source: str, what: str, fix: str = ""):
    """`load(source)`, with an error that names the agent (the loader's names only the id). transformers raises an
    OSError for a missing or unreachable model, a ValueError for a folder without a usable config or tokenizer; the
    kind is kept."""
    try:
        return load(source)
    except (OSError, ValueError) as err:
        kind = OSError if isinstance(err, OSError) else ValueError
        raise kind(f"MAGRPOTrainer: {what} could not be loaded: {err}{fix}") from err


def _tokenizer(spec, label: str, trust_remote_code: bool):
    load = partial(AutoTokenizer.from_pretrained, trust_remote_code=trust_remote_code)
    if isinstance(spec, str):
        return _from_pretrained(load, spec, f"the tokenizer of {label} = {spec!r}")
    model = spec.model if isinstance(spec, _Copy) else spec
    source = getattr(model.config, "_name_or_path", "") if hasattr(model, "config") else ""
    where = f"the tokenizer of {label} (a model in memory, whose config names {source!r})"
    return _from_pretrained(load, source, where, fix=" Pass `processing_class=`.")


def _load_agent(spec, label: str, model_init_kwargs: dict | None) -> torch.nn.Module:
    if isinstance(spec, _Copy):
        return copy.deepcopy(spec.model)
    if isinstance(spec, str):
        load = partial(AutoModelForCausalLM.from_pretrained, **(model_init_kwargs or {}))
        return _from_pretrained(load, spec, f"{label} = {spec!r}")
    return spec  # a model in memory (`_check_spec` allowed nothing else)


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


def _resize_to(tokenizer, model) -> None:
    rows = model.get_input_embeddings().weight.size(0)
    if len(tokenizer) > rows:
        model.resize_token_embeddings(len(tokenizer))
        logger.info(
            f"MAGRPOTrainer: the tokenizer has {len(tokenizer)} tokens (special tokens added) and the model's "
            f"embeddings {rows} rows; resized them to the tokenizer (the new rows start untrained)."
        )


def _prepare_tokenizer_and_model(tokenizer, model) -> list[int]:
    """Give the tokenizer a pad token, mirror it on the model, and return every id that ends a completion."""
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.config.get_text_config().pad_token_id = tokenizer.pad_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    eos = model.generation_config.eos_token_id
    eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    return eos if tokenizer.eos_token_id in eos else [tokenizer.eos_token_id, *eos]
