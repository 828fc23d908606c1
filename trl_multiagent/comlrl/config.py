"""CoMLRL 1.4.3's `MAGRPOConfig`: its names and defaults, as fields of a subclass of the TRL face's config.

Each CoMLRL name is a field with CoMLRL's default; `__post_init__` checks CoMLRL's values (`check_comlrl_values`) and
sets the TRL fields they mean (`translate`: the one table `TRL_FIELDS`, and the batch layout) before GRPOConfig's own
`__post_init__` derives the batch layout from them. A CoMLRL name set after construction is checked by the same function
and applied from the same table when the trainer is built (`check_late_changes`). Two CoMLRL names are
`TrainingArguments` properties, `train_batch_size` and `eval_batch_size` (rows per step, times devices): here they are
`InitVar`s, so that `inspect.signature(MAGRPOConfig.__init__)` lists them (CoMLRL's companion scripts keep only the keys
it lists), they set what they mean, and reading them gives `TrainingArguments`' values, which the Trainer uses; CoMLRL's
values are `config.comlrl_batch_sizes`. Setting one after construction is refused (docs/from_comlrl.md).
"""

from __future__ import annotations

import copy
import dataclasses
import os
from dataclasses import InitVar, dataclass, field

from transformers import TrainingArguments
from transformers.utils import logging

from ..config import MAGRPOConfig as TRLFaceConfig
from ..credit.returns import joint_choices
from ..devices import has_accelerator


logger = logging.get_logger(__name__)

ADVANTAGE_MODES = {"mean": "mean", "rloo": "rloo", "max": "max", "raw": "none"}  # CoMLRL's -> advantage_baseline
PARALLEL_TRAINING = ("none", "mp")
JOINT_MODES = {"align": "aligned", "aligned": "aligned", "cross": "cross", "crossed": "cross"}
LAUNCH = (
    "one process per device with `accelerate launch --config_file accelerate_configs/multi_gpu.yaml` (or zero2.yaml, "
    "zero3.yaml for DeepSpeed); every process holds the whole team, DeepSpeed ZeRO shards it"
)
# The CoMLRL names whose TRL fields `translate` sets once, from which GRPOConfig derives the batch layout and the
# evaluation schedule: set after construction, they are refused (`check_late_changes`), not silently ignored.
LAYOUT_NAMES = ("rollout_buffer_size", "eval_interval")


def _beta(config) -> float:
    return float(config.reference_kl_coef) if config.reference_kl_enabled else 0.0


def normalisation(config) -> str:
    """CoMLRL's `advantage_normalization` as the core's `scale_rewards`: on, each group's advantages minus their mean
    over their population std, clamped at 1e-6 (`credit.options.group_zscore`, CoMLRL 1.4.3's
    `MAGRPOTrainer._compute_loss_with_gradients`); off, the advantages as the baseline leaves them."""
    return "group_zscore" if config.advantage_normalization else "none"


# CoMLRL's names that set one TRL field each: the TRL field, and the value it gets from the config. `translate` sets
# them when the config is built, `check_late_changes` again for a name set afterwards. The two KL names set one field,
# `beta`, which the first of them given names when a `beta` given beside it disagrees (`_put`).
TRL_FIELDS = {
    "agent_learning_rate": ("learning_rate", lambda c: float(c.agent_learning_rate)),
    "advantage_mode": ("advantage_baseline", lambda c: ADVANTAGE_MODES[str(c.advantage_mode).lower()]),
    "advantage_normalization": ("scale_rewards", normalisation),
    "reference_kl_enabled": ("beta", _beta),
    "reference_kl_coef": ("beta", _beta),
}


@dataclass
class MAGRPOConfig(TRLFaceConfig):
    r"""
    CoMLRL 1.4.3's `MAGRPOConfig` on the TRL face's config: CoMLRL's names and defaults (`num_turns=2`,
    `early_termination_threshold=-0.2`, `agent_learning_rate=5e-6`, `temperature=0.6`, `top_p=0.6`, `top_k=50`,
    `num_train_epochs=20`, `logging_steps=50`, `max_new_tokens=256`), each CoMLRL name setting the TRL fields it means.
    TRL's own fields are here too, with TRL's names (docs/from_comlrl.md has every name, default and what is not
    provided).

    Parameters:
        agent_learning_rate (`float`, defaults to `5e-6`): `learning_rate`, with a constant schedule, as CoMLRL trains.
        parallel_training (`str`, defaults to `"none"`): `"none"` or `"mp"` (`None`/`"null"` are `"none"`). Here each
            process holds the whole team; devices other than the process's are refused, naming `accelerate launch`.
        agent_devices, reference_devices (`str` or `list[str]`, *optional*): this process's device, or `"auto"`.
        external_prompt_passthrough (`bool`, defaults to `False`): `False` formats each later turn's prompt with the
            formatters too, as CoMLRL does; `True` gives the transition's prompts as they are.
        eval_interval (`int`, defaults to `16`): evaluate every this many one-prompt steps (`eval_steps`), with an
            `eval_dataset`, and before training; 0: never.
        eval_num_samples (`int`, defaults to `4`): rows of `eval_dataset` evaluated.
        eval_batch_size (`int`, defaults to `1`): prompts per evaluation batch: `per_device_eval_batch_size` rows.
        rollout_buffer_size (`int`, defaults to `2`), train_batch_size (`int`, *optional*): tree nodes of an agent per
            generation and per optimizer step; a prompt's tree is never split (`per_device_train_batch_size`,
            `steps_per_generation`).
        advantage_normalization (`bool`, defaults to `True`): `scale_rewards="group_zscore"`, CoMLRL's rule: the
            group's advantages minus their mean, over their population std (`False`: `"none"`, no scaling). With it
            on, every `advantage_mode` gives the same advantages, as in CoMLRL.
        advantage_mode (`str`, defaults to `"mean"`): `advantage_baseline` (`mean`, `rloo`, `max`; `raw` is `none`).
        discount (`float`, defaults to `1.0`): kept, as in CoMLRL, whose MAGRPO does not use it: its returns are
            undiscounted sums over the tree. Another value is said once at WARNING and trained as `1.0`.

    The update is CoMLRL's where TRL's loss can express it (docs/from_comlrl.md, "The objective"): sequence-summed
    log-probs (`loss_type="luspo"`, `importance_sampling_level="sequence"`) at temperature 1 (`logprob_temperature`),
    no gradient clipping (`max_grad_norm=0`), and torch's AdamW with its weight decay (`optim="adamw_torch"`,
    `weight_decay=0.01`, on every parameter).
        reference_kl_enabled (`bool`, defaults to `False`), reference_kl_coef (`float`, defaults to `0.1`): `beta`.
    """

    names_other_faces = False  # a refused name here gets the closest CoMLRL and TRL names (`KnownKeywords`)

    # CoMLRL's defaults for the fields both configs have
    num_train_epochs: float = field(default=20, metadata={"help": "Total number of training epochs (CoMLRL: 20)."})
    logging_steps: float = field(default=50, metadata={"help": "Log every this many steps (CoMLRL: 50)."})
    num_agents: int | None = field(default=2, metadata={"help": "Team size for `agent_model` (CoMLRL: 2)."})
    num_generations: int | None = field(default=4, metadata={"help": "Completions per agent and node (K)."})
    max_new_tokens: int | None = field(default=256, metadata={"help": "Longest completion, in tokens (CoMLRL: 256)."})
    temperature: float = field(default=0.6, metadata={"help": "Sampling temperature (CoMLRL: 0.6)."})
    top_p: float = field(default=0.6, metadata={"help": "Nucleus sampling (CoMLRL: 0.6)."})
    top_k: int = field(default=50, metadata={"help": "Top-k sampling (CoMLRL: 50)."})
    num_turns: int = field(default=2, metadata={"help": "Number of turns (CoMLRL: 2)."})
    early_termination_threshold: float | None = field(
        default=-0.2,
        metadata={
            "help": "A node whose mean joint reward is above this value is not expanded (CoMLRL: -0.2, so a reward "
            "that is never negative ends every branch after turn 1). None: every turn runs."
        },
    )
    save_strategy: str = field(
        default="no",
        metadata={
            "help": "No checkpoint unless asked, as CoMLRL: train(checkpoint_dir=...) or save_checkpoint (TRL's "
            "'steps'/'epoch' still write the Trainer's checkpoint-{step} in output_dir)."
        },
    )
    lr_scheduler_type: str = field(default="constant", metadata={"help": "CoMLRL's AdamW has no schedule."})
    discount: float = field(
        default=1.0,
        metadata={
            "help": "Kept, as in CoMLRL, and not used: its MAGRPO's returns are undiscounted (another value is said)."
        },
    )
    # CoMLRL's update: torch's AdamW at its defaults, no clipping; REINFORCE's sequence-summed log-probs at temperature 1
    optim: str = field(default="adamw_torch", metadata={"help": "torch's AdamW, as CoMLRL builds it."})
    weight_decay: float = field(default=0.01, metadata={"help": "AdamW's weight decay (CoMLRL: torch's, 0.01)."})
    max_grad_norm: float = field(default=0.0, metadata={"help": "Gradient clipping; 0: none (CoMLRL clips none)."})
    loss_type: str = field(
        default="luspo",
        metadata={"help": "TRL's loss; 'luspo' at the sequence level sums each completion's log-probs, as CoMLRL."},
    )
    importance_sampling_level: str = field(
        default="sequence", metadata={"help": "'sequence': with 'luspo', CoMLRL's sequence-summed gradient."}
    )
    logprob_temperature: float | None = field(
        default=1.0, metadata={"help": "Temperature of the update's log-probs (CoMLRL: 1, the model's own)."}
    )

    # CoMLRL's own names
    agent_learning_rate: float = field(default=5e-6, metadata={"help": "Each agent's learning rate (learning_rate)."})
    parallel_training: str | None = field(default="none", metadata={"help": "'none' or 'mp' (devices: see docs)."})
    agent_devices: list[str] | None = field(
        default=None, metadata={"help": "This process's device (or a list, or 'auto')."}
    )
    external_prompt_passthrough: bool = field(
        default=False, metadata={"help": "Give later turns the transition's prompts unformatted."}
    )
    eval_interval: int = field(default=16, metadata={"help": "Evaluate every this many one-prompt steps; 0: never."})
    eval_num_samples: int = field(default=4, metadata={"help": "Rows of eval_dataset evaluated."})
    rollout_buffer_size: int = field(default=2, metadata={"help": "Tree nodes of an agent per generation."})
    advantage_normalization: bool = field(
        default=True, metadata={"help": "scale_rewards='group_zscore', CoMLRL's rule (False: 'none')."}
    )
    advantage_mode: str = field(default="mean", metadata={"help": "mean, rloo, max or raw (advantage_baseline)."})
    reference_kl_enabled: bool = field(default=False, metadata={"help": "A KL term against each agent's copy."})
    reference_kl_coef: float = field(default=0.1, metadata={"help": "Its coefficient (beta)."})
    reference_devices: list[str] | None = field(default=None, metadata={"help": "This process's device (or a list)."})
    train_batch_size: InitVar[int | None] = None
    eval_batch_size: InitVar[int | None] = None

    def __post_init__(self, train_batch_size: int | None, eval_batch_size: int | None):
        # CoMLRL's two batch sizes in its terms (tree nodes per optimizer step, prompts per evaluation batch): the
        # values given, else CoMLRL's defaults; `given_batch_sizes` names those given
        self.given_batch_sizes = [
            n
            for n, v in (("train_batch_size", train_batch_size), ("eval_batch_size", eval_batch_size))
            if v is not None
        ]
        self.comlrl_batch_sizes = {
            "train_batch_size": train_batch_size if train_batch_size is not None else self.rollout_buffer_size,
            "eval_batch_size": eval_batch_size if eval_batch_size is not None else 1,
        }
        check_comlrl_values(self)
        translate(self)
        super().__post_init__()
        self._translated = comlrl_values(self)  # what `check_late_changes` compares with


def _refuse_setting(name: str):
    def setter(self, value):
        raise AttributeError(
            f"MAGRPOConfig: {name} (CoMLRL) is given to the constructor, MAGRPOConfig({name}=...): here it sets "
            "per_device_train_batch_size/per_device_eval_batch_size, from which the batch layout is derived when the "
            "config is built; reading it gives TrainingArguments' value (docs/from_comlrl.md)."
        )

    return setter


# The dataclass took these two names as `InitVar`s (their class attributes, None, hid TrainingArguments' properties);
# the properties come back, with a setter that says why they cannot be set afterwards.
MAGRPOConfig.train_batch_size = property(TrainingArguments.train_batch_size.fget, _refuse_setting("train_batch_size"))
MAGRPOConfig.eval_batch_size = property(TrainingArguments.eval_batch_size.fget, _refuse_setting("eval_batch_size"))


def comlrl_values(config: MAGRPOConfig) -> dict:
    """The values of CoMLRL's own fields (those the TRL face lacks), and of the TRL face's that `check_comlrl_values`
    also reads."""
    return {name: getattr(config, name) for name in (*COMLRL_FIELDS, "num_agents", "joint_mode")}


COMLRL_FIELDS = [f.name for f in dataclasses.fields(MAGRPOConfig) if f.name not in TRLFaceConfig.__dataclass_fields__]


def _default(config, name: str):
    f = type(config).__dataclass_fields__[name]
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def _put(config, name: str, value, comlrl_name: str) -> None:
    """Set TRL field `name` to what CoMLRL's `comlrl_name` means. A TRL field given (not at its default) wins over a
    CoMLRL name left at its default, and must agree with one that was given."""
    current, comlrl_given = getattr(config, name), getattr(config, comlrl_name) != _default(config, comlrl_name)
    if current != _default(config, name):
        if not comlrl_given or current == value:
            return
        raise ValueError(
            f"MAGRPOConfig: {comlrl_name}={getattr(config, comlrl_name)!r} (CoMLRL) sets {name}={value!r}, but "
            f"{name}={current!r} is also given. Pass one of them."
        )
    setattr(config, name, value)


def _parallel_mode(value) -> str:
    """CoMLRL's normalisation: None, "" and "null" are "none"; case and spaces do not matter."""
    mode = str(value or "none").strip().lower()
    return "none" if mode == "null" else mode


def check_comlrl_values(config: MAGRPOConfig) -> None:
    """CoMLRL's own refusals of its names (its `MAGRPOConfig.__post_init__`): when the config is built, and again when
    the trainer is if one of them was set after construction (`check_late_changes`). The TRL fields are the TRL face's
    to check."""
    for name, value in {"rollout_buffer_size": config.rollout_buffer_size, **config.comlrl_batch_sizes}.items():
        if value < 1:
            raise ValueError(f"{type(config).__name__}: {name} (CoMLRL) must be >= 1, got {value}.")
    for name in ("eval_interval", "eval_num_samples", "reference_kl_coef"):
        if not getattr(config, name) >= 0:
            raise ValueError(f"{type(config).__name__}: {name} (CoMLRL) must be >= 0, got {getattr(config, name)}.")
    if str(config.advantage_mode).lower() not in ADVANTAGE_MODES:
        raise ValueError(
            f"{type(config).__name__}: advantage_mode={config.advantage_mode!r} (CoMLRL) must be one of {list(ADVANTAGE_MODES)}; "
            "it sets advantage_baseline (TRL face's name), where the peers' other baselines are."
        )
    if config.num_agents != 1 and str(config.joint_mode).strip().lower() not in JOINT_MODES:
        raise ValueError(
            f"{type(config).__name__}: joint_mode={config.joint_mode!r} must be one of {list(JOINT_MODES)} (any case; with "
            "num_agents=1 it is ignored, as in CoMLRL)."
        )
    mode = _parallel_mode(config.parallel_training)
    if mode not in PARALLEL_TRAINING:
        raise ValueError(
            f"{type(config).__name__}: parallel_training={config.parallel_training!r} (CoMLRL) must be one of "
            f"{list(PARALLEL_TRAINING)} (or None/'null' for 'none')."
        )
    if mode == "mp" and config.agent_devices is None:
        raise ValueError(
            f"{type(config).__name__}: parallel_training='mp' (CoMLRL) needs agent_devices, as in CoMLRL."
        )
    for name in ("agent_devices", "reference_devices"):
        if getattr(config, name) is not None:
            _check_one_device(name, getattr(config, name))
    # CoMLRL resolves a list of devices to one per agent when it places them (agents with 'mp', references with the
    # KL term): one device for all, or one per agent
    for name, placed in (("agent_devices", mode == "mp"), ("reference_devices", config.reference_kl_enabled)):
        spec = getattr(config, name)
        if placed and isinstance(spec, (list, tuple)) and len(spec) not in (1, config.num_agents):
            raise ValueError(
                f"{type(config).__name__}: {name} length ({len(spec)}) must be 1 or num_agents ({config.num_agents}), as in "
                f"CoMLRL; got {list(spec)}."
            )


def core_joint_mode(config: MAGRPOConfig) -> str:
    """The core's joint mode for CoMLRL's spelling (align/aligned, cross/crossed, any case); a single agent has no
    joint choice, so any value is read as 'aligned', as CoMLRL ignores it."""
    mode = str(config.joint_mode).strip().lower()
    return JOINT_MODES[mode] if config.num_agents != 1 or mode in JOINT_MODES else "aligned"


def process_device() -> str:
    """The device this process trains on: 'cpu' without an accelerator, else 'cuda:<LOCAL_RANK>'."""
    return f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}" if has_accelerator() else "cpu"


def _check_one_device(name: str, spec) -> None:
    """CoMLRL places agents on devices; here each process holds the whole team on its one device. A spec that names
    that device (or 'auto') is accepted, said once; any other is refused with how to use several devices."""
    entries = [spec] if isinstance(spec, str) else list(spec)
    here = process_device()
    kind = here.split(":")[0]
    if not entries:
        raise ValueError(f"MAGRPOConfig: {name}={spec!r} (CoMLRL) must be a device, a non-empty list or 'auto'.")
    if all(str(e).strip().lower() in ("auto", kind, here) for e in entries):
        logger.info_once(
            f"MAGRPOConfig: {name}={spec!r} (CoMLRL) names this process's device ({here}); every agent trains there, "
            "as each process holds the whole team."
        )
        return
    raise ValueError(
        f"MAGRPOConfig: {name}={spec!r} (CoMLRL) places agents on devices other than this process's ({here}); here, "
        f"use {LAUNCH}."
    )


def translate(config: MAGRPOConfig) -> None:
    """Set the TRL fields that CoMLRL's names mean (`TRL_FIELDS`, and the batch layout), before GRPOConfig derives the
    batch layout from them; `check_comlrl_values` has refused what CoMLRL refuses."""
    config.joint_mode = core_joint_mode(config)
    config.parallel_training = _parallel_mode(config.parallel_training)
    for comlrl_name, (trl_name, value) in TRL_FIELDS.items():
        _put(config, trl_name, value(config), comlrl_name)
    if config.reference_kl_enabled:
        logger.info_once(
            f"MAGRPOConfig: reference_kl_enabled=True (CoMLRL) -> beta={config.beta}: TRL's KL term in the loss, "
            "against each agent's frozen copy (CoMLRL subtracts it from the returns instead)."
        )
    k = config.num_generations
    if not (isinstance(k, int) and k >= 1) or config.num_turns < 1:
        return  # no batch layout: the TRL face's checks refuse num_generations or num_turns, naming them
    rows, given = config.comlrl_batch_sizes["eval_batch_size"] * k, "eval_batch_size" in config.given_batch_sizes
    if config.per_device_eval_batch_size == _default(config, "per_device_eval_batch_size"):
        config.per_device_eval_batch_size = rows
    elif given and config.per_device_eval_batch_size != rows:
        raise ValueError(
            f"MAGRPOConfig: eval_batch_size={rows // k} (CoMLRL, prompts) sets per_device_eval_batch_size={rows}, but "
            f"per_device_eval_batch_size={config.per_device_eval_batch_size} is also given. Pass one of them."
        )
    _rollout_buffer(config)
    _eval_interval(config, int(config.eval_interval))


def nodes_per_tree(num_generations: int, num_turns: int, joint_mode: str, num_agents: int) -> int:
    """Nodes of one agent in a prompt's full tree: 1 + J + J**2 + ... over the turns, J joint answers per node."""
    joint = len(joint_choices(num_agents, num_generations, joint_mode))
    return sum(joint**t for t in range(num_turns))


def _rollout_buffer(config: MAGRPOConfig) -> None:
    """CoMLRL updates once its buffer holds `rollout_buffer_size` tree nodes of an agent, one optimizer step per
    `train_batch_size` of them. Here a prompt's tree is never split: a generation takes the trees of
    `rollout_buffer_size // nodes per tree` prompts (at least one), an optimizer step those of
    `train_batch_size // nodes per tree`. With `num_turns=1` a tree is one node, and the counts are CoMLRL's."""
    k, buffer = config.num_generations, int(config.rollout_buffer_size)
    nodes = nodes_per_tree(k, config.num_turns, config.joint_mode, config.num_agents or 2)
    per_generation = max(buffer // nodes, 1)
    step_nodes = int(config.comlrl_batch_sizes["train_batch_size"])
    per_step = min(max(step_nodes // nodes, 1), per_generation)
    per_generation -= per_generation % per_step
    rows = config.per_device_train_batch_size
    if rows != _default(config, "per_device_train_batch_size"):  # TRL's layout given: it wins over CoMLRL's defaults
        given = buffer != _default(config, "rollout_buffer_size") or "train_batch_size" in config.given_batch_sizes
        if given and rows != per_step * k:
            raise ValueError(
                f"MAGRPOConfig: rollout_buffer_size={buffer} (CoMLRL) sets per_device_train_batch_size={per_step * k}, "
                f"but per_device_train_batch_size={rows} is also given. Pass one of them."
            )
        return
    config.per_device_train_batch_size = per_step * k
    config.gradient_accumulation_steps = 1
    config.steps_per_generation = per_generation // per_step
    config.comlrl_layout = True  # `fit_to_prompts` may shrink it to a smaller dataset
    logger.info_once(
        f"MAGRPOConfig: rollout_buffer_size={buffer}, train_batch_size={step_nodes} (CoMLRL, tree nodes; a prompt's "
        f"tree has {nodes}) -> each generation takes {per_generation} prompt(s) per process and an optimizer step "
        f"{per_step}: per_device_train_batch_size={per_step * k}, steps_per_generation={per_generation // per_step}."
    )


def fit_to_prompts(config: MAGRPOConfig, prompts: int) -> None:
    """CoMLRL trains one prompt at a time, so a dataset with fewer prompts than one generation here takes still trains
    (a one-row dataset: one prompt per step). When the layout is CoMLRL's (`_rollout_buffer` derived it; a TRL layout
    given stays as given, and the core names the shortfall), a generation takes the prompts there are, at least one per
    process, and an optimizer step at most that many. `generation_batch_size` and the evaluation schedule follow."""
    k, world = config.num_generations, config.world_size
    if not vars(config).get("comlrl_layout") or prompts * k >= config.generation_batch_size or prompts < world:
        return
    per_step = min(config.per_device_train_batch_size // k, prompts // world)
    per_generation = prompts // world - (prompts // world) % per_step
    config.per_device_train_batch_size = per_step * k
    config.steps_per_generation = per_generation // per_step
    config.generation_batch_size = per_generation * k * world
    _eval_interval(config, int(config.eval_interval))
    logger.info_once(
        f"MAGRPOTrainer: train_dataset has {prompts} prompt(s), fewer than one generation took: each generation takes "
        f"{per_generation} per process and an optimizer step {per_step} (per_device_train_batch_size="
        f"{config.per_device_train_batch_size}, steps_per_generation={config.steps_per_generation}), as CoMLRL trains "
        "one prompt at a time."
    )


def _eval_interval(config: MAGRPOConfig, interval: int) -> None:
    """CoMLRL evaluates every `interval` one-prompt steps, from the first; a step here takes several prompts. The
    trainer turns evaluation off when there is no `eval_dataset`, as CoMLRL does."""
    if interval <= 0:
        config.eval_strategy = "no"
        return
    rows = config.per_device_train_batch_size * config.gradient_accumulation_steps
    prompts = max(rows * int(os.environ.get("WORLD_SIZE", "1")) // config.num_generations, 1)
    config.eval_strategy, config.eval_steps, config.eval_on_start = "steps", max(round(interval / prompts), 1), True


def check_late_changes(config: MAGRPOConfig) -> MAGRPOConfig:
    """The config to train with: a CoMLRL name set after the config was built takes effect (in a copy, which sets the
    TRL field it means), or is refused when GRPOConfig derived the batch layout from it (`LAYOUT_NAMES`); never
    ignored (`TRL_FIELDS`). `joint_mode`'s CoMLRL spellings are read as the core's.

    CoMLRL's values were checked when the config was built (`check_comlrl_values`); they are checked again only if one
    was set since, as no setter checks a dataclass field."""
    translated = vars(config).get("_translated", {})
    changed = [name for name, value in comlrl_values(config).items() if translated.get(name) != value]
    if changed:
        check_comlrl_values(config)
    layout = [name for name in changed if name in LAYOUT_NAMES]
    if layout:
        raise ValueError(
            f"MAGRPOConfig: {layout} (CoMLRL) set after the config was built: the batch layout and the evaluation "
            "schedule are derived from them when it is built. Pass them to MAGRPOConfig(...) instead."
        )
    updated = copy.copy(config)  # the caller's config stays as it was: it may build another trainer
    for name in changed:
        if name in TRL_FIELDS:
            trl_name, value = TRL_FIELDS[name]
            setattr(updated, trl_name, value(config))
    updated.joint_mode = core_joint_mode(config)
    return updated


def say_early_termination(config: MAGRPOConfig) -> None:
    """With several turns and CoMLRL's default threshold, say once what the threshold does: with a reward that is
    never negative, no branch reaches turn 2."""
    default = MAGRPOConfig.__dataclass_fields__["early_termination_threshold"].default
    if config.num_turns > 1 and config.early_termination_threshold == default:
        logger.warning_once(
            f"MAGRPOTrainer: num_turns={config.num_turns} with early_termination_threshold={default} (CoMLRL's "
            f"default): after each turn, a node whose mean joint reward is above {default} is not expanded. With a "
            "reward that is never negative no branch reaches turn 2. Set early_termination_threshold=None to run "
            "every turn, or a value that only a good enough answer scores above."
        )


def undiscounted(config: MAGRPOConfig) -> None:
    """CoMLRL's MAGRPO keeps `discount` but sums the rewards over the tree undiscounted (its `compute_returns`; docs
    `marl/multi-turn-interaction.md`): the trainer's copy of the config trains with `discount=1.0`, and another value
    is said once, so that it is not silently dropped."""
    if config.discount != 1.0:
        logger.warning_once(
            f"MAGRPOTrainer: discount={config.discount} is not used, as in CoMLRL 1.4.3, whose MAGRPO sums the rewards "
            "over the turns undiscounted (return = reward + mean return of the next turn). Training with discount=1.0. "
            "For discounted returns, use the TRL face, trl_multiagent.MAGRPOTrainer."
        )
    config.discount = 1.0
