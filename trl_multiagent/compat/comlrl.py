"""CoMLRL 1.4.3's MAGRPO names, and what each becomes here: the config's (`config_keywords`, translated into the fields
they mean before the config is built; read back by `read_name`) and the trainer's (`trainer_arguments`, `Evaluation`,
and the reward keyword `batch_items`, the core's `rows`: `rows_named`).
This is the only module that knows CoMLRL; the core reaches it through `MAGRPOConfig`'s constructor (its type hands
every `MAGRPOConfig(...)` call's keywords here once) and `trainer_arguments`.

A CoMLRL script runs with its import changed (``from trl_multiagent import MAGRPOConfig, MAGRPOTrainer``). Each name
keeps CoMLRL's meaning, said once in the log when the unit shifts (prompts and rows, tree nodes and prompts); the values
CoMLRL refuses are refused here, and a device setting is refused only when it names another device than this
process's, with the `accelerate launch` line to use instead. The config names are constructor keywords, no dataclass
fields, so TRL's command-line parser and `TrainingArguments`' own properties (`train_batch_size`, `eval_batch_size`)
are untouched.

Fields with the same name and meaning in both (`num_train_epochs`, `logging_steps`, `num_generations`,
`max_new_tokens`, `temperature`, `top_p`, `top_k`, `num_turns`, `discount`, `joint_mode`,
`early_termination_threshold`, `num_agents`) need nothing. Their *defaults* are TRL's here, not CoMLRL's.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace

import torch
from transformers import TrainerCallback
from transformers.utils import logging
from trl import GRPOConfig

from ..callables import callable_name
from ..credit.options import BASELINES
from ..credit.returns import joint_choices
from ..devices import has_accelerator


logger = logging.get_logger(__name__)

LAUNCH = (
    "one process per device with `accelerate launch --config_file accelerate_configs/multi_gpu.yaml` (or zero2.yaml, "
    "zero3.yaml for DeepSpeed); every process holds the whole team, DeepSpeed ZeRO shards it"
)
# CoMLRL's advantage_mode -> advantage_baseline, from the name each baseline gives it (`credit_options.Baseline.comlrl`)
ADVANTAGE_MODES = {baseline.comlrl: name for name, baseline in BASELINES.items() if baseline.comlrl is not None}
PARALLEL_TRAINING = ("none", "mp")
BATCH_ITEMS = "batch_items"  # CoMLRL's reward keyword: the dataset row of each joint action, the core's `rows`
# CoMLRL 1.4.3's `MAGRPOConfig` names that TRL's `GRPOConfig` lacks, with their types (for the constructor's signature)
CONFIG_NAMES = {
    "agent_learning_rate": "float | None",
    "parallel_training": "str | None",
    "agent_devices": "str | list[str] | None",
    "external_prompt_passthrough": "bool | None",
    "eval_interval": "int | None",
    "eval_num_samples": "int | None",
    "eval_batch_size": "int | None",
    "rollout_buffer_size": "int | None",
    "train_batch_size": "int | None",
    "advantage_normalization": "bool | None",
    "advantage_mode": "str | None",
    "reference_kl_enabled": "bool | None",
    "reference_kl_coef": "float | None",
    "reference_devices": "str | list[str] | None",
}
# What a config reads back in CoMLRL's terms (`read_name`): every name but the two that stay `TrainingArguments'`
# properties (rows per step, times devices), and `comlrl`: all of them, those two included, in CoMLRL's terms.
READ_BACK = (*(name for name in CONFIG_NAMES if name not in ("train_batch_size", "eval_batch_size")), "comlrl")
_GIVEN = "_comlrl_given"  # the attribute of a built config that holds the CoMLRL names it was given (`remember`)


def init_signature(init: Callable) -> inspect.Signature:
    """The dataclass `init`'s signature with CoMLRL's names added as keywords (default None): what the config's
    constructor takes. CoMLRL's companion scripts keep only the keys that `inspect.signature(MAGRPOConfig.__init__)`
    lists, so this is the signature `MAGRPOConfig.__init__` (and a `@dataclass` subclass's) reports."""
    signature = inspect.signature(init)
    kept = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
    varkw = [p for p in signature.parameters.values() if p.kind is p.VAR_KEYWORD]
    added = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=annotation)
        for name, annotation in CONFIG_NAMES.items()
        if name not in signature.parameters
    ]
    return signature.replace(parameters=[*kept, *added, *varkw])


def config_keywords(cls, args: tuple, kwargs: dict) -> tuple[dict, dict]:
    """`cls(*args, **kwargs)`'s keywords in the core's terms, and the CoMLRL names given (those not None), before the
    dataclass `__init__` runs: each CoMLRL name sets the fields it means (`apply_config_names`). A name that is
    neither a field nor CoMLRL's raises Python's `TypeError`, as a dataclass would (scripts catch it), naming the
    closest names: the config's own, TRL's (`GRPOConfig`, `TrainingArguments`) and CoMLRL's."""
    accepted = [name for name in inspect.signature(cls.__init__).parameters if name != "self"]
    for name in kwargs:
        if name not in accepted:
            raise TypeError(_unknown_name(cls, name, accepted))
    given = {name: kwargs[name] for name in CONFIG_NAMES if kwargs.get(name) is not None}
    core = {name: value for name, value in kwargs.items() if name not in CONFIG_NAMES}
    if not given:
        return core, given
    draft = Draft(cls, args, core)
    k = draft.num_generations
    if isinstance(k, int) and k >= 2:  # else the config refuses num_generations, naming it
        apply_config_names(draft, given)
    return {**core, **draft.updates}, given


def _unknown_name(cls, name: str, accepted: list[str]) -> str:
    def origin(candidate: str) -> str:
        if candidate in CONFIG_NAMES:
            return "CoMLRL's"
        return "TRL's" if candidate in GRPOConfig.__dataclass_fields__ else f"{cls.__name__}'s"

    close = difflib.get_close_matches(name, accepted, n=3, cutoff=0.6)
    hint = "Closest names: " + ", ".join(f"{c!r} ({origin(c)})" for c in close) if close else "No name is close"
    return (
        f"{cls.__name__}.__init__() got an unexpected keyword argument {name!r}. {hint}. Every field: "
        "docs/configuration.md."
    )


class Draft:
    """The values a config is about to be built with (given, else the field's default), read as its attributes;
    `put` records what CoMLRL's names change (`updates`: the keywords the config is then built with)."""

    def __init__(self, cls, args: tuple, kwargs: dict):
        fields = dataclasses.fields(cls)
        self.defaults = {
            f.name: f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default for f in fields
        }
        positional = dict(zip([f.name for f in fields if f.init], args, strict=False))
        self.given = {**positional, **kwargs}
        self.updates: dict = {}

    def __getattr__(self, name: str):
        for values in (self.updates, self.given, self.defaults):
            if name in values:
                return values[name]
        raise AttributeError(name)

    def put(self, name: str, value, comlrl_name: str) -> None:
        """Set field `name` for CoMLRL's `comlrl_name`; a value given for the field too must agree."""
        current = getattr(self, name)
        if current != self.defaults[name] and current != value:
            raise ValueError(
                f"MAGRPOConfig: {comlrl_name} (CoMLRL) sets {name}={value!r}, but {name}={current!r} is also given. "
                "Pass one of them."
            )
        self.updates[name] = value


def remember(config, given: dict) -> None:
    """Keep the CoMLRL names `config` was built with, for `read_name` and the trainer (`trainer_arguments`).
    `dataclasses.replace` builds a config from its fields only: the copy keeps the fields these names set."""
    if given:
        vars(config)[_GIVEN] = dict(given)


def read_name(config, name: str):
    """A CoMLRL name read off a config, in CoMLRL's terms, derived from the TRL fields it set so that it cannot
    disagree with them; AttributeError for any other name (the config's `__getattr__` asks only when `name` is no
    field or property)."""
    if name not in READ_BACK:
        raise AttributeError(f"{type(config).__name__!r} object has no attribute {name!r}")
    given = vars(config).get(_GIVEN, {})
    if name == "comlrl":
        names = {n: read_name(config, n) for n in READ_BACK if n != "comlrl"}
        names["train_batch_size"] = given.get("train_batch_size", given.get("rollout_buffer_size"))
        names["eval_batch_size"] = max(config.per_device_eval_batch_size // config.num_generations, 1)
        return SimpleNamespace(num_agents=config.num_agents, **names)
    derived = {
        "agent_learning_rate": lambda: config.learning_rate,
        "advantage_mode": lambda: {b: m for m, b in ADVANTAGE_MODES.items()}[config.advantage_baseline],
        "advantage_normalization": lambda: config.scale_rewards != "none",
        "reference_kl_enabled": lambda: config.beta > 0,
        "reference_kl_coef": lambda: config.beta if config.beta > 0 else given.get("reference_kl_coef", 0.1),
        "parallel_training": lambda: _parallel_mode(given.get("parallel_training")),
        "external_prompt_passthrough": lambda: bool(given.get("external_prompt_passthrough", False)),
    }
    return derived[name]() if name in derived else given.get(name)


def set_name(config, name: str, value) -> None:
    """`config.agent_learning_rate = x` sets `learning_rate`, as on CoMLRL's config; the other names are given to the
    constructor (they set several fields at once), and setting one afterwards raises AttributeError naming it."""
    if name == "agent_learning_rate":
        config.learning_rate = float(value)
        return
    raise AttributeError(
        f"MAGRPOConfig: {name} (CoMLRL) is given to the constructor, MAGRPOConfig({name}=...), which sets the TRL "
        "fields it means; set those fields instead (docs/from_comlrl.md)."
    )


def _parallel_mode(value) -> str:
    """CoMLRL's normalisation: None, "" and "null" are "none"; case and spaces do not matter."""
    mode = str(value or "none").strip().lower()
    return "none" if mode == "null" else mode


def check_config_names(given: dict) -> None:
    """CoMLRL's own refusals of its names (its `MAGRPOConfig.__post_init__`), before anything is translated."""
    for name in ("rollout_buffer_size", "train_batch_size", "eval_batch_size"):
        if name in given and given[name] < 1:
            raise ValueError(f"MAGRPOConfig: {name} (CoMLRL) must be >= 1, got {given[name]}.")
    for name in ("eval_interval", "eval_num_samples", "reference_kl_coef"):
        if name in given and not given[name] >= 0:
            raise ValueError(f"MAGRPOConfig: {name} (CoMLRL) must be >= 0, got {given[name]}.")
    if "advantage_mode" in given and str(given["advantage_mode"]).lower() not in ADVANTAGE_MODES:
        raise ValueError(
            f"MAGRPOConfig: advantage_mode={given['advantage_mode']!r} (CoMLRL) must be one of {list(ADVANTAGE_MODES)}; "
            f"here it is advantage_baseline, one of {list(BASELINES)}."
        )
    mode = _parallel_mode(given.get("parallel_training"))
    if mode not in PARALLEL_TRAINING:
        raise ValueError(
            f"MAGRPOConfig: parallel_training={given['parallel_training']!r} (CoMLRL) must be one of "
            f"{list(PARALLEL_TRAINING)} (or None/'null' for 'none')."
        )
    if mode == "mp" and given.get("agent_devices") is None:
        raise ValueError("MAGRPOConfig: parallel_training='mp' (CoMLRL) needs agent_devices, as in CoMLRL.")
    for name in ("agent_devices", "reference_devices"):
        if given.get(name) is not None:
            _check_one_device(name, given[name])


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


def nodes_per_tree(num_generations: int, num_turns: int, joint_mode: str, num_agents: int) -> int:
    """Nodes of one agent in a prompt's full tree: 1 + J + J**2 + ... over the turns, J joint answers per node."""
    joint = len(joint_choices(num_agents, num_generations, joint_mode))
    return sum(joint**t for t in range(num_turns))


def apply_config_names(config: Draft, given: dict) -> None:
    """Set the TRL fields that CoMLRL's names mean, on the keywords a config is about to be built with. A name and its
    TRL field must agree when both are given."""
    check_config_names(given)
    if "agent_learning_rate" in given:
        config.put("learning_rate", float(given["agent_learning_rate"]), "agent_learning_rate")
        if config.lr_scheduler_type == config.defaults["lr_scheduler_type"]:
            config.updates["lr_scheduler_type"] = "constant"  # CoMLRL's AdamW has no schedule
            logger.info_once(
                "MAGRPOConfig: agent_learning_rate (CoMLRL) -> learning_rate, with lr_scheduler_type='constant' as "
                "CoMLRL trains (set lr_scheduler_type for TRL's schedules)."
            )
    if "advantage_mode" in given:
        config.put("advantage_baseline", ADVANTAGE_MODES[str(given["advantage_mode"]).lower()], "advantage_mode")
    if "advantage_normalization" in given:
        normalise = bool(given["advantage_normalization"])
        config.put("scale_rewards", "group" if normalise else "none", "advantage_normalization")
        if normalise:
            logger.info_once(
                "MAGRPOConfig: advantage_normalization=True (CoMLRL) -> scale_rewards='group': each group's "
                "advantages are divided by the group's std (TRL's GRPO), after the baseline."
            )
    if given.get("reference_kl_enabled"):
        config.put("beta", float(given.get("reference_kl_coef", 0.1)), "reference_kl_enabled")
        logger.info_once(
            f"MAGRPOConfig: reference_kl_enabled=True (CoMLRL) -> beta={config.beta}: TRL's KL term in the loss, "
            "against each agent's frozen copy (CoMLRL subtracts it from the returns instead)."
        )
    elif "reference_kl_enabled" in given:
        config.put("beta", 0.0, "reference_kl_enabled")
    k = config.num_generations
    if "eval_batch_size" in given:
        prompts = int(given["eval_batch_size"])
        config.put("per_device_eval_batch_size", prompts * k, "eval_batch_size")
        logger.info_once(
            f"MAGRPOConfig: eval_batch_size={prompts} (CoMLRL, prompts) -> per_device_eval_batch_size={prompts * k} "
            "(rows: prompts x num_generations, as in TRL)."
        )
    if "rollout_buffer_size" in given or "train_batch_size" in given:
        _rollout_buffer(config, given)
    if "eval_interval" in given:
        _eval_interval(config, int(given["eval_interval"]))


def _rollout_buffer(config: Draft, given: dict) -> None:
    """CoMLRL updates once its buffer holds `rollout_buffer_size` tree nodes of an agent, one optimizer step per
    `train_batch_size` of them. Here a prompt's tree is never split: a generation takes the trees of
    `rollout_buffer_size // nodes per tree` prompts (at least one), an optimizer step those of
    `train_batch_size // nodes per tree`. With `num_turns=1` a tree is one node, and the counts are CoMLRL's."""
    k = config.num_generations
    nodes = nodes_per_tree(k, config.num_turns, config.joint_mode, config.num_agents or 2)
    buffer = int(given.get("rollout_buffer_size", 2))  # CoMLRL's default
    per_generation = max(buffer // nodes, 1)
    per_step = min(max(int(given.get("train_batch_size", buffer)) // nodes, 1), per_generation)
    per_generation -= per_generation % per_step
    config.put("per_device_train_batch_size", per_step * k, "rollout_buffer_size")
    config.put("gradient_accumulation_steps", 1, "rollout_buffer_size")
    config.put("steps_per_generation", per_generation // per_step, "rollout_buffer_size")
    logger.info_once(
        f"MAGRPOConfig: rollout_buffer_size={buffer}, train_batch_size={given.get('train_batch_size', buffer)} "
        f"(CoMLRL, tree nodes; a prompt's tree has {nodes}) -> each generation takes {per_generation} prompt(s) per "
        f"process and an optimizer step {per_step}: per_device_train_batch_size={per_step * k}, "
        f"steps_per_generation={per_generation // per_step}."
    )


def _eval_interval(config: Draft, interval: int) -> None:
    """CoMLRL evaluates every `interval` one-prompt steps, from the first; a step here takes several prompts."""
    if interval <= 0:
        config.put("eval_strategy", "no", "eval_interval")
        return
    rows = config.per_device_train_batch_size * config.gradient_accumulation_steps
    prompts = max(rows * int(os.environ.get("WORLD_SIZE", "1")) // config.num_generations, 1)
    steps = max(round(interval / prompts), 1)
    config.put("eval_strategy", "steps", "eval_interval")
    config.put("eval_steps", steps, "eval_interval")
    if not config.eval_on_start:
        config.updates["eval_on_start"] = True  # CoMLRL evaluates before its first step too
    logger.info_once(
        f"MAGRPOConfig: eval_interval={interval} (CoMLRL, one-prompt steps) -> eval_strategy='steps', "
        f"eval_steps={steps} (a step here takes {prompts} prompts), eval_on_start=True."
    )


def later_turn_formatter(formatters, args) -> Callable[[dict, list], list] | None:
    """CoMLRL 1.4.3 formats every later turn's prompt too, unless `external_prompt_passthrough=True`: each agent's
    formatter gets the row with `prompt` set to the transition's prompt (and `external_prompts=` when it takes it).
    Returns that formatting as `(row, transition prompts) -> prompts`, or None when it does not apply."""
    if formatters is None or args.num_turns == 1 or args.external_prompt_passthrough:
        return None
    logger.info_once(
        "MAGRPOTrainer: the formatters also format each later turn's prompt, from the row with 'prompt' set to the "
        "transition's (CoMLRL's rule); set MAGRPOConfig(external_prompt_passthrough=True) to give the agents the "
        "transition's prompts as they are."
    )

    def format_later_turn(row: dict, prompts: list) -> list:
        return [
            f({**row, "prompt": p}, external_prompts=p)
            if "external_prompts" in inspect.signature(f).parameters
            else f({**row, "prompt": p})
            for f, p in zip(formatters, prompts, strict=True)
        ]

    return format_later_turn


MODEL_CONFIG_KEYS = ("torch_dtype", "dtype", "attn_implementation", "model_kwargs", "special_tokens")
# wandb_config keys CoMLRL 1.4.3 reads, and the environment variable each becomes (transformers' WandbCallback and
# wandb read them); `name`/`run_name`, `tags` and `config_sections` are handled apart.
WANDB_ENVIRONMENT = {
    "project": "WANDB_PROJECT",
    "entity": "WANDB_ENTITY",
    "dir": "WANDB_DIR",
    "mode": "WANDB_MODE",
    "id": "WANDB_RUN_ID",
    "resume": "WANDB_RESUME",
}
WANDB_KEYS = (*WANDB_ENVIRONMENT, "name", "run_name", "tags", "config_sections")


@dataclass
class CoMLRLArguments:
    """What `trainer_arguments` resolves, for the core to use without knowing CoMLRL."""

    args: object  # the config to train with (a copy when these keywords change it)
    model: object
    num_agents: int | None
    eval_dataset: object
    # CoMLRL's `reward_processor` as the core's reward transform (`rewards.JointReward(transform=)`), named after it
    reward_transform: Callable[[float], float] | None
    special_tokens: dict | None  # added to every agent's tokenizer
    eval_metrics: list  # callables `(tree, rows, num_turns) -> metrics` run on each evaluation rollout
    callbacks: list

    # the keywords CoMLRL's reward functions take that the core's lack: a dataset column may not be named so
    reserved_keywords = (BATCH_ITEMS,)

    def later_turn_formatter(self, formatters: list | None) -> Callable[[dict, list], list] | None:
        return later_turn_formatter(formatters, self.args)

    def one_value_for_several(self, name: str, count: int, turn: int, first_alone: Callable[[], float | None]):
        return read_one_value(name, count, turn, first_alone)

    def reward_functions(self, funcs):
        """`reward_func`/`reward_funcs` (None, one, or a list) with CoMLRL's `batch_items` translated (`rows_named`)."""
        if funcs is None:
            return None
        if isinstance(funcs, (list, tuple)):
            return [rows_named(f) for f in funcs]
        return rows_named(funcs)

    def add_special_tokens(self, tokenizers: list) -> None:
        add_special_tokens(tokenizers, self.special_tokens)


def trainer_arguments(kwargs: dict, args, *, agents, model, num_agents, eval_dataset) -> CoMLRLArguments:
    """The trainer's one seam: translate `MAGRPOTrainer(**kwargs)`'s CoMLRL-only keywords into its own.

    `agent_model` is `model` (copied `MAGRPOConfig(num_agents=)` times, else 2 as in CoMLRL); `model_config`'s dtype
    and attention become `args.model_init_kwargs`, its `special_tokens` are added to the tokenizers; `wandb_config`
    becomes `report_to="wandb"`, `run_name`, `WANDB_*` and the run's config; `eval_logger` and `eval_aggregator` are
    called on each evaluation rollout (`Evaluation`); the config's `eval_num_samples` keeps that many rows of
    `eval_dataset`, and its `eval_interval` evaluates only when there is an `eval_dataset` (as in CoMLRL).
    """
    kwargs = dict(kwargs)
    agent_model = kwargs.pop("agent_model", None)
    if agent_model is not None and agents is not None:
        _check_agent_model_names(agent_model, agents)  # CoMLRL accepts both when they name the same model
    elif agent_model is not None:
        if model is not None:
            raise ValueError("MAGRPOTrainer: pass `model` or `agent_model` (CoMLRL's name), not both.")
        model = agent_model
        if num_agents is None and args.num_agents is None:
            num_agents = 2  # CoMLRL's default team
    reward_processor = kwargs.pop("reward_processor", None)
    if reward_processor is not None and not callable(reward_processor):
        raise TypeError(
            f"MAGRPOTrainer: reward_processor must be a callable float -> float, got {reward_processor!r}."
        )
    evaluation = Evaluation.from_arguments(kwargs.pop("eval_logger", None), kwargs.pop("eval_aggregator", None))
    model_config = kwargs.pop("model_config", None)
    wandb_config = kwargs.pop("wandb_config", None)
    dataset_type = kwargs.pop("dataset_type", None)  # CoMLRL <= 1.4.2: a label of the wandb run's config
    if dataset_type is not None and wandb_config:
        sections = {**(wandb_config.get("config_sections") or {}), "dataset_type": dataset_type}
        wandb_config = {**wandb_config, "config_sections": sections}
    if dataset_type is not None:
        logger.info_once(f"MAGRPOTrainer: dataset_type={dataset_type!r} (CoMLRL <= 1.4.2) labels the wandb run only.")
    if kwargs:
        raise TypeError(f"MAGRPOTrainer got unexpected keyword arguments {sorted(kwargs)}.")
    no_evaluation = args.eval_interval is not None and eval_dataset is None
    if model_config or wandb_config or no_evaluation:
        args = copy.copy(args)  # the caller's config stays as it was: it may build another trainer
    special_tokens = _model_config(model_config, args) if model_config else None
    callbacks = _wandb_config(wandb_config, args) if wandb_config else []
    samples = args.eval_num_samples
    if samples is not None and eval_dataset is not None and samples < len(eval_dataset):
        eval_dataset = eval_dataset.select(range(max(samples, 1)))  # CoMLRL evaluates one item even at 0
    if no_evaluation:
        args.eval_strategy, args.eval_on_start = "no", False
    return CoMLRLArguments(
        args=args,
        model=model,
        num_agents=num_agents,
        eval_dataset=eval_dataset,
        reward_transform=_reward_transform(reward_processor) if reward_processor is not None else None,
        special_tokens=special_tokens,
        eval_metrics=[evaluation] if evaluation is not None else [],
        callbacks=callbacks,
    )


def rows_named(func):
    """A reward function as the core calls it, when it takes CoMLRL's `batch_items`: by name, which the core's
    signature reading sees as its `rows` (`rewards.REWARD_KEYWORDS`), or through ``**kwargs``, which get it beside
    `rows`. Any other function (a reward model, one that takes neither) is returned as it is. The wrapper keeps the
    function's name and stated convention, and is sync or async as the function is (the core awaits its result).

    >>> def comlrl_reward(completions1, completions2, batch_items=None):
    ...     return [float(row["target"]) for row in batch_items]
    >>> import inspect
    >>> reward = rows_named(comlrl_reward)
    >>> str(inspect.signature(reward)), reward(["a"], ["b"], rows=[{"target": 3}])
    ('(completions1, completions2, rows=None)', [3.0])
    """
    if not callable(func) or isinstance(func, (str, torch.nn.Module)):
        return func
    signature = inspect.signature(func)
    takes_any = any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values())
    if BATCH_ITEMS not in signature.parameters and not takes_any:
        return func
    named = BATCH_ITEMS in signature.parameters and "rows" not in signature.parameters

    def translated(*args, **kwargs):
        if "rows" in kwargs:
            kwargs[BATCH_ITEMS] = kwargs.pop("rows") if named else kwargs["rows"]
        return func(*args, **kwargs)

    functools.update_wrapper(translated, func)  # its module and stated convention (`reward_wrappers`)
    translated.__name__ = callable_name(func)  # a callable object's name too, which update_wrapper leaves out
    if named:
        parameters = [p.replace(name="rows") if p.name == BATCH_ITEMS else p for p in signature.parameters.values()]
        translated.__signature__ = signature.replace(parameters=parameters)
    return translated


def read_one_value(name: str, count: int, turn: int, first_alone: Callable[[], float | None]) -> float | None:
    """CoMLRL 1.4.3's reward convention, read from what an unstated joint function returns (`rewards.JointReward`'s
    `one_value_for_several`): one value for `count` joint actions means that it scores one joint action per call.
    Returns joint action 0's value scored alone (`first_alone`); the core then calls it once per joint action. When
    that call fails too, the function is not CoMLRL's but drops values (an off-by-one slice): one error says so, not
    a convention WARNING and then a count error."""
    try:
        first = first_alone()
    except (TypeError, ValueError) as error:
        raise ValueError(
            f"Reward function {name!r} returned 1 value for {count} joint actions (turn {turn}), and, called with one "
            f"joint action (CoMLRL's per-joint-action convention), failed: {error} It drops values (a slice such as "
            "completions[1:]?): return one value per joint action, as many as each list of completions has."
        ) from error
    logger.warning_once(
        f"Reward function {name!r} returned 1 value for {count} joint actions (turn {turn}), so it is read as CoMLRL's "
        "per-joint-action convention: it will be called once per joint action, with one-element lists, "
        f"batch_items=[row] and prompts=[agent 0's prompt], and its value kept. If it scores one joint action per "
        f"call, state it with per_joint_action({name}) (from trl_multiagent). If this is a bug, return one value per "
        f"joint action (as many as each list of completions has), and state joint({name}) to make a wrong count an "
        "error."
    )
    return first


def _reward_transform(reward_processor: Callable[[float], float]) -> Callable[[float], float]:
    """CoMLRL's `reward_processor`, applied to every reward value before the weighted sum, as the core's transform;
    named `reward_processor(<its name>)`, the keyword the user gave, for the errors that name it."""

    def transform(value: float) -> float:
        return reward_processor(value)

    transform.__name__ = f"reward_processor({callable_name(reward_processor)})"
    return transform


def _check_agent_model_names(agent_model, agents) -> None:
    """CoMLRL 1.4.3 takes `agent_model` beside `agents` when every agent is that model (by id, or by its config's
    `_name_or_path`); the agents are then used as given."""
    for i, agent in enumerate(agents):
        name = agent if isinstance(agent, str) else getattr(getattr(agent, "config", None), "_name_or_path", None)
        if name != agent_model:
            raise ValueError(
                f"MAGRPOTrainer: agent_model={agent_model!r} conflicts with agents[{i}] ({name!r}); CoMLRL takes both "
                "only when every agent is that model. Pass one of them."
            )


def _model_config(model_config: dict, args) -> dict | None:
    """`model_config`'s loading keywords into `args.model_init_kwargs`; returns its `special_tokens`."""
    unknown = sorted(set(model_config) - set(MODEL_CONFIG_KEYS))
    if unknown:
        raise ValueError(
            f"MAGRPOTrainer: model_config keys {unknown} (CoMLRL) have no equivalent here; it takes "
            f"{list(MODEL_CONFIG_KEYS)}."
        )
    kwargs = dict(model_config.get("model_kwargs") or {})
    for key in ("torch_dtype", "dtype", "attn_implementation"):
        if model_config.get(key) is not None:
            kwargs["dtype" if key == "torch_dtype" else key] = model_config[key]
    args.model_init_kwargs = {**(args.model_init_kwargs or {}), **kwargs}
    return model_config.get("special_tokens") or None


def add_special_tokens(tokenizers: list, special_tokens: dict | None) -> None:
    """CoMLRL's `model_config["special_tokens"]`: `tokenizer.add_special_tokens(...)` on every agent's tokenizer
    (`assembly.build_team(resize_embeddings=True)` then grows each agent's embeddings to its tokenizer)."""
    if not special_tokens:
        return
    for tokenizer in {id(t): t for t in tokenizers}.values():
        tokenizer.add_special_tokens(special_tokens)


def _wandb_config(wandb_config: dict, args) -> list:
    """CoMLRL's `wandb_config` as TRL's: `report_to="wandb"`, `run_name`, the `WANDB_*` variables wandb reads, and
    `config_sections` merged into the run's config (returns the callback that does it)."""
    unknown = sorted(set(wandb_config) - set(WANDB_KEYS))
    if unknown:
        raise ValueError(
            f"MAGRPOTrainer: wandb_config keys {unknown} have no equivalent here; it takes {list(WANDB_KEYS)} (set "
            "other wandb settings with WANDB_* environment variables)."
        )
    if "wandb" not in (args.report_to or []):
        args.report_to = [*(t for t in (args.report_to or []) if t != "none"), "wandb"]
    name = wandb_config.get("name") or wandb_config.get("run_name")
    if name:
        args.run_name = name
    for key, variable in WANDB_ENVIRONMENT.items():
        if wandb_config.get(key):
            os.environ[variable] = str(wandb_config[key])
    if wandb_config.get("tags"):
        os.environ["WANDB_TAGS"] = ",".join(wandb_config["tags"])
    sections = wandb_config.get("config_sections")
    if not isinstance(sections, dict) or not sections:
        return []
    output = sections.get("output")
    if isinstance(output, dict) and output.get("verbose") is False:
        args.disable_tqdm = True  # CoMLRL's `config_sections.output.verbose=False` turns its progress bars off
    return [WandbConfigSections(sections)]


class WandbConfigSections(TrainerCallback):
    """Adds CoMLRL's `wandb_config["config_sections"]` to the wandb run's config once the run exists, as CoMLRL's
    `wandb.init(config=...)` does (`dataset.name`/`dataset.type` also as `dataset_name`/`dataset_type`)."""

    def __init__(self, sections: dict):
        self.sections = dict(sections)
        dataset = sections.get("dataset")
        if isinstance(dataset, dict):
            self.sections.update({f"dataset_{k}": dataset[k] for k in ("name", "type") if k in dataset})

    def on_train_begin(self, args, state, control, **kwargs):
        import wandb

        if state.is_world_process_zero and wandb.run is not None:
            wandb.run.config.update(self.sections, allow_val_change=True)


class Evaluation:
    """CoMLRL's `eval_logger` and `eval_aggregator`, called as CoMLRL calls them on each evaluation batch:
    ``eval_logger(agent_completions_turns=[agent][item][turn], batch_items=rows, prompts=[row prompt])``, then
    ``eval_aggregator(its result, num_turns=T)``, whose dict is logged as `eval_{key}` (CoMLRL: `eval/{key}`).

    An item's path is CoMLRL's: one answer per agent per turn, here the first joint answer of each node and the
    branch it leads to.
    """

    def __init__(self, eval_logger: Callable, eval_aggregator: Callable):
        self.eval_logger, self.eval_aggregator = eval_logger, eval_aggregator

    @classmethod
    def from_arguments(cls, eval_logger, eval_aggregator) -> Evaluation | None:
        for name, func in (("eval_logger", eval_logger), ("eval_aggregator", eval_aggregator)):
            if func is not None and not callable(func):
                raise TypeError(f"MAGRPOTrainer: {name} must be callable, got {func!r}.")
        if (eval_logger is None) != (eval_aggregator is None):
            given = "eval_logger" if eval_logger is not None else "eval_aggregator"
            raise ValueError(
                f"MAGRPOTrainer: {given} is given alone; CoMLRL calls eval_logger and eval_aggregator together (the "
                "aggregator turns the logger's per-item metrics into the logged values). Pass both."
            )
        return None if eval_logger is None else cls(eval_logger, eval_aggregator)

    def __call__(self, tree, rows: list[dict], num_turns: int) -> dict[str, float]:
        completions = [first_paths(tree, len(rows), agent) for agent in range(len(tree.nodes[0].completions))]
        detailed = self.eval_logger(
            agent_completions_turns=completions, batch_items=rows, prompts=[row.get("prompt", "") for row in rows]
        )
        aggregated = self.eval_aggregator(detailed, num_turns=num_turns)
        if not isinstance(aggregated, dict):
            raise TypeError(f"MAGRPOTrainer: eval_aggregator must return a dict of metrics, got {aggregated!r}.")
        return {str(key): float(value) for key, value in aggregated.items()}


def first_paths(tree, num_rows: int, agent: int) -> list[list[str]]:
    """Per dataset row, `agent`'s answer at each turn along the first joint answer of every node."""
    paths = []
    for row in range(num_rows):
        node = next(n for n in tree.nodes if n.row == row and n.parent is None)
        path = []
        while node is not None:
            action = tree.joint_actions[node.joint_actions[0]]
            path.append(node.completions[agent][action.choice[agent]])
            node = tree.nodes[action.child] if action.child is not None else None
        paths.append(path)
    return paths
