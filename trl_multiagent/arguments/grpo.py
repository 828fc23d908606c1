"""GRPOTrainer's own arguments, for a team: the one refused (`rollout_func`), the config as `GRPOTrainer.__init__`
must see it (`grpo_trainer_settings`), `quantization_config` for the agents, and the reward models of `reward_funcs`,
loaded as GRPOTrainer loads them."""

from __future__ import annotations

import contextlib
import importlib.util

from transformers import AutoModelForSequenceClassification

from ..devices import has_accelerator


# GRPOTrainer arguments with no multi-agent meaning here, and what to use instead.
REFUSED_GRPO_ARGUMENTS = {
    "rollout_func": (
        "TRL's `rollout_func(prompts, trainer)` generates for the trainer's one policy and returns one flat batch, "
        "while a team's rollout is a tree whose turns interleave N policies, the joint reward and the transition, so "
        "no call of it can stand for one agent's turn. Agents that act in a world are what `environment_factory=` "
        "(and `tools=`) give a team; what they see between turns is `external_transition`, and `formatters` the "
        "first prompt (docs: Agents that act)"
    ),
}


def check_grpo_arguments(**arguments) -> None:
    """GRPOTrainer's `rollout_func`: refused when given, with the reason and the equivalent."""
    for name, instead in REFUSED_GRPO_ARGUMENTS.items():
        if arguments.get(name) is not None:
            raise ValueError(
                f"MAGRPOTrainer: `{name}` (a GRPOTrainer argument) is not supported for a team: {instead}."
            )


# What `GRPOTrainer.__init__` is given instead of the config's values (`reward_weights`: the team's, at the call)
SETTINGS_FOR_GRPO_INIT = {
    "beta": 0.0,
    "use_vllm": False,
    "model_init_kwargs": None,
    "cast_lm_head_to_fp32": False,
    "sync_ref_model": False,
    "reward_weights": None,
}


@contextlib.contextmanager
def grpo_trainer_settings(args, reward_weights: list[float]):
    """The config as `GRPOTrainer.__init__` must see it, restored afterwards (the trainer reads the real values).

    This is a contract with TRL's `GRPOTrainer.__init__`, which reads these fields from `args` while it runs and
    builds, for the team, what would be wrong: tests/test_private_api_contract.py
    (`test_grpo_init_reads_the_settings_the_team_gives_it`) checks how it reads each one.

    - `reward_weights`: one per reward function handed to GRPOTrainer, the environments' `get_reward` columns
      included (`rewards.resolve_weights`); TRL appends those columns' weights itself only for its own environments;
    - `beta=0.0`: GRPOTrainer would build one reference model from a hub id; each agent's reference is built by
      `MAGRPOTrainer` instead (a frozen copy, or the adapter's base);
    - `use_vllm=False`: GRPOTrainer would start one vLLM engine for one policy; the team's engines are the generation
      backend's (`generation.build_generator`). Also, GRPOTrainer fills `self.generation_kwargs` (the transformers
      backend's sampling settings) only when `use_vllm` is false;
    - `model_init_kwargs=None`: the agents are already loaded (`build_team` used it); GRPOTrainer would warn that it
      is ignored;
    - `cast_lm_head_to_fp32=False`: GRPOTrainer would cast the container's `lm_head`, which it has not; each agent's
      is cast by `MAGRPOTrainer` (`team.assembly.fused_heads_on_agents`);
    - `sync_ref_model=False`: GRPOTrainer would sync its one reference model; the team's references are synced by
      `team.reference_sync`.
    """
    given = {**SETTINGS_FOR_GRPO_INIT, "reward_weights": list(reward_weights)}
    saved = {name: getattr(args, name) for name in given}
    for name, value in given.items():
        setattr(args, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(args, name, value)


def quantized_model_init_kwargs(quantization_config, model_init_kwargs: dict | None, specs: list) -> dict | None:
    """GRPOTrainer's `quantization_config`, for agents loaded from ids: added to the loading keywords, as GRPOTrainer
    does. bitsandbytes needs a CUDA GPU; agents given as models in memory are already loaded."""
    if quantization_config is None:
        return model_init_kwargs
    if not has_accelerator() or importlib.util.find_spec("bitsandbytes") is None:
        raise ValueError(
            "MAGRPOTrainer: quantization_config (bitsandbytes) needs a CUDA GPU and `pip install bitsandbytes`; this "
            f"machine has {'a GPU' if has_accelerator() else 'no GPU'} and bitsandbytes "
            f"{'installed' if importlib.util.find_spec('bitsandbytes') else 'not installed'}. Leave it None (TRL's "
            "`get_quantization_config` gives None without --load_in_4bit/--load_in_8bit)."
        )
    in_memory = [i for i, spec in enumerate(specs) if not isinstance(spec, str)]
    if in_memory:
        raise ValueError(
            f"MAGRPOTrainer: quantization_config applies to agents loaded from an id or a folder; agent(s) {in_memory} "
            "are models in memory. Load them quantized yourself, or pass their ids."
        )
    if "quantization_config" in (model_init_kwargs or {}):
        raise ValueError(
            "MAGRPOTrainer: `quantization_config` is given both as a trainer argument and in `args.model_init_kwargs`; "
            "set it in one place, as GRPOTrainer asks."
        )
    return {**(model_init_kwargs or {}), "quantization_config": quantization_config}


def load_reward_models(funcs: list, args) -> list:
    """`reward_funcs` with each model id loaded as a sequence-classification reward model (one label), as
    GRPOTrainer loads it; GRPOTrainer then prepares it and its tokenizer (`reward_processing_classes`)."""
    kwargs = {k: v for k, v in (args.model_init_kwargs or {}).items() if k != "quantization_config"}
    kwargs.setdefault("trust_remote_code", args.trust_remote_code)
    if args.distributed_state.distributed_type != "NO":
        kwargs["device_map"] = None  # as GRPOTrainer: "auto" fails under DDP and DeepSpeed
    return [
        AutoModelForSequenceClassification.from_pretrained(f, num_labels=1, **kwargs) if isinstance(f, str) else f
        for f in funcs
    ]
