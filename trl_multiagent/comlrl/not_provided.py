"""The public names of CoMLRL 1.4.3 that this face does not provide: the one table of them, and the module
`__getattr__` that turns ``from trl_multiagent.comlrl... import NAME`` for one of them into an `ImportError` naming it.

Each name is listed with what it is in CoMLRL and the CoMLRL modules that export it (their `__all__`, or what their
`__init__` imports), relative to `comlrl`. The face's modules with the same paths refuse it with `NotProvidedError`;
the flat `trl_multiagent.comlrl` refuses every name here. A name this face provides is not in the table.
"""

from __future__ import annotations

from collections.abc import Callable


DOCS = "docs/from_comlrl.md (section 'Trainer families')"
FACE = "trl_multiagent.comlrl"

_ACTOR_CRITIC = ("trainers", "trainers.actor_critic")
_PREFERENCE = ("trainers", "trainers.preference")
_PREFERENCE_ONLY = ("trainers.preference",)
_UTILS = ("utils",)

# name -> (what it is in CoMLRL, the CoMLRL modules that export it, relative to `comlrl`)
NOT_PROVIDED: dict[str, tuple[str, tuple[str, ...]]] = {
    # actor-critic family
    "ActorCriticTrainerBase": ("actor-critic trainers' base class", _ACTOR_CRITIC),
    "RolloutSample": ("actor-critic rollout record", ("trainers.actor_critic",)),
    # preference family
    "MADPOConfig": ("multi-agent DPO config", _PREFERENCE),
    "MADPOTrainer": ("multi-agent DPO trainer", _PREFERENCE),
    "MARLHFConfig": ("multi-agent RLHF config", _PREFERENCE),
    "MARLHFTrainer": ("multi-agent RLHF trainer", _PREFERENCE),
    "JointRewardModel": ("MARLHF's learned joint reward model", _PREFERENCE),
    "MADPOIterConfig": ("iterative multi-agent DPO config", _PREFERENCE_ONLY),
    "MADPOIterTrainer": ("iterative multi-agent DPO trainer", _PREFERENCE_ONLY),
    "MARLHFIterConfig": ("iterative multi-agent RLHF config", _PREFERENCE_ONLY),
    "MARLHFIterTrainer": ("iterative multi-agent RLHF trainer", _PREFERENCE_ONLY),
    # models and schedulers
    "CausalLMWithValueHead": ("actor-critic model with a value head", ("models",)),
    "ValueHead": ("actor-critic value head", ("models",)),
    "ActorCriticOutput": ("actor-critic model output", ("models",)),
    "DeviceScheduler": ("placement of agents on devices", ("schedulers",)),
    # utilities: CoMLRL's trainers' internals (the face does their work in TRL's terms)
    # CoMLRL's own checkpoint file (training_state.pt); checkpoints here are the Trainer's
    "TrainingCheckpointMixin": ("checkpoint machinery of its trainers", ("utils.checkpoint",)),
    "capture_trainer_state": ("checkpoint machinery of its trainers", ("utils.checkpoint",)),
    "restore_trainer_state": ("checkpoint machinery of its trainers", ("utils.checkpoint",)),
    "capture_rng_state": ("checkpoint machinery of its trainers", ("utils.checkpoint",)),
    "restore_rng_state": ("checkpoint machinery of its trainers", ("utils.checkpoint",)),
    "build_formatters": ("trainer helper (formatters)", _UTILS),
    "ensure_pad_token": ("trainer helper (tokenizers)", _UTILS),
    "ensure_tokenizer": ("trainer helper (tokenizers)", _UTILS),
    "apply_tokenizer_specials": ("trainer helper (tokenizers)", _UTILS),
    "resolve_tokenizers": ("trainer helper (tokenizers)", _UTILS),
    "infer_model_name": ("trainer helper (model loading)", _UTILS),
    "resolve_model_sources": ("trainer helper (model loading)", _UTILS),
    "clone_reference_models": ("trainer helper (reference KL)", _UTILS),
    "load_reference_models_from_sources": ("trainer helper (reference KL)", _UTILS),
    "reference_kl_coef": ("trainer helper (reference KL)", _UTILS),
    "reference_kl_enabled": ("trainer helper (reference KL)", _UTILS),
    "reference_kl_for_sequence": ("trainer helper (reference KL)", _UTILS),
    "resolve_reference_devices": ("trainer helper (reference KL)", _UTILS),
    "validate_reference_kl_config": ("trainer helper (reference KL)", _UTILS),
    "call_reward_function": ("trainer helper (reward calls)", _UTILS),
    "normalize_reward_lengths": ("trainer helper (reward calls)", _UTILS),
    "resolve_reward_range": ("trainer helper (reward ranges)", _UTILS),
    "set_reward_range": ("trainer helper (reward ranges)", _UTILS),
    "DistributedContext": ("trainer helper (processes)", _UTILS),
    "local_context": ("trainer helper (processes)", _UTILS),
    "unwrap_model": ("trainer helper (processes)", _UTILS),
}


class NotProvidedError(ImportError):
    """A public name of CoMLRL 1.4.3 that `trl_multiagent.comlrl` does not provide."""


def not_provided_message(name: str) -> str:
    what, modules = NOT_PROVIDED[name]
    where = ", ".join(f"comlrl.{module}" for module in modules)
    return (
        f"{name} (CoMLRL 1.4.3's {what}, in {where}) is not provided by {FACE}: the face provides CoMLRL's MAGRPO, "
        f"REINFORCE family and actor-critic trainers (IAC, MAAC). {DOCS} lists what is provided and what is not."
    )


def names_of(module: str | None) -> list[str]:
    """The table's names that CoMLRL's `comlrl.{module}` exports; `None`: every name (the flat face)."""
    return sorted(name for name, (_, modules) in NOT_PROVIDED.items() if module is None or module in modules)


def module_getattr(module_name: str, module: str | None) -> Callable[[str], object]:
    """The `__getattr__` of the face's module `module_name`, which stands for CoMLRL's `comlrl.{module}` (`None`: the
    flat face, which refuses every name of the table): a name of the table raises `NotProvidedError` naming it; any
    other missing name, Python's usual `AttributeError` (so `hasattr` and `from ... import` of a misspelling behave as
    for any module)."""
    refused = frozenset(names_of(module))

    def __getattr__(name: str):
        if name in refused:
            raise NotProvidedError(not_provided_message(name), name=name)
        raise AttributeError(f"module {module_name!r} has no attribute {name!r}")

    return __getattr__
