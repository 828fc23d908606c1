"""`MAGRPOTrainer`'s arguments, checked and resolved before any model is loaded (`prepare`).

Config fields are checked in `MAGRPOConfig.check` (run again here); the agents and tokenizers in
`team.assembly.plan_team`; CoMLRL's own arguments are translated in `compat.comlrl.trainer_arguments`, the trainer's
one seam to CoMLRL (`prepare` calls it, and uses only what it returns). This module holds the rest: GRPOTrainer's own
arguments, the user's functions and datasets, and the reward models of `reward_funcs`.
"""

from __future__ import annotations

import contextlib
import importlib.util
from dataclasses import dataclass

from datasets import Dataset, IterableDataset
from transformers import AutoModelForSequenceClassification
from transformers.utils import logging
from trl.data_utils import is_conversational

from .compat import comlrl
from .devices import has_accelerator
from .diagnostics import LearningSignalCallback, say_early_termination
from .generation.vllm_settings import check_vllm_team
from .rollout.callables import Transition, _short, callable_name, check_prompt
from .rollout.environment import EMPTY_CHAT, TeamEnvironment
from .rollout.rewards import JointReward, check_agent_reward_aggregation, each_agent, resolve_weights, reward_name
from .rollout.tools import ToolCalling
from .rollout.worlds import Worlds
from .team.assembly import TeamPlan, load_tokenizers, plan_team


logger = logging.get_logger(__name__)

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


# DeepSpeed's schedulers that multiply each group's own initial rate, so keep the agents' ratios; the others (WarmupLR,
# WarmupDecayLR, OneCycle, LRRangeTest) set the rate given in their params, one for every group.
RATIO_KEEPING_DEEPSPEED_SCHEDULERS = ("WarmupCosineLR",)


def check_agent_learning_rates(args, optimizers) -> None:
    """`agent_learning_rates` is applied by the Trainer's own optimizer (`team.optimizer`): refused with an optimizer
    given to the trainer (`optimizers=`), which the Trainer uses as it is, and with a DeepSpeed config (`deepspeed=`,
    or `accelerate launch`'s) whose "optimizer" section (DeepSpeed's optimizer, its parameters in one group) or
    "scheduler" section (one rate for every group) would replace the per-agent rates. Their count is checked in
    `user_functions`, once the team's size is known."""
    rates = args.agent_learning_rates
    if rates is None:
        return
    if optimizers is not None and optimizers[0] is not None:
        raise ValueError(
            f"MAGRPOTrainer: `optimizers=` gives an optimizer, and MAGRPOConfig.agent_learning_rates={list(rates)} "
            "asks for one learning rate per agent; the Trainer uses a given optimizer as it is, so the per-agent "
            "rates would be ignored. Pass one of the two: build the per-agent groups into your optimizer "
            "(`trainer.team.agent_parameters(i)`), or leave `optimizers` unset."
        )
    config = getattr(getattr(args, "deepspeed_plugin", None), "deepspeed_config", None) or {}
    sections = [f'"optimizer" ({config["optimizer"].get("type")})'] if "optimizer" in config else []
    scheduler = config.get("scheduler")
    if scheduler is not None and scheduler.get("type") not in RATIO_KEEPING_DEEPSPEED_SCHEDULERS:
        sections.append(f'"scheduler" ({scheduler.get("type")})')
    if sections:
        raise ValueError(
            f"MAGRPOConfig.agent_learning_rates={list(rates)} sets one rate per agent in the Trainer's optimizer, but "
            f"the DeepSpeed config has {' and '.join(sections)}: DeepSpeed's own optimizer holds every parameter in "
            f"one group, and its schedulers other than {', '.join(RATIO_KEEPING_DEEPSPEED_SCHEDULERS)} set one rate "
            "for every group, so the per-agent rates would be ignored. Remove that section from the DeepSpeed config "
            "(the Trainer's `optim` and `lr_scheduler_type` then apply), or leave agent_learning_rates None."
        )


@contextlib.contextmanager
def grpo_trainer_settings(args, reward_weights: list[float]):
    """The config as `GRPOTrainer.__init__` must see it, restored afterwards (the trainer reads the real values):

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
    names = ("beta", "use_vllm", "model_init_kwargs", "cast_lm_head_to_fp32", "sync_ref_model", "reward_weights")
    saved = {name: getattr(args, name) for name in names}
    for name, value in zip(names, (0.0, False, None, False, False, list(reward_weights)), strict=True):
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


def named_eval_datasets(eval_dataset) -> list[tuple[str, object]]:
    """`eval_dataset` as (name, dataset) pairs: one, or each of a dict of them (a `DatasetDict` too), which Trainer
    evaluates one by one (`eval_{name}_*` keys).

    >>> [name for name, _ in named_eval_datasets({"easy": None, "hard": None})]
    ["eval_dataset['easy']", "eval_dataset['hard']"]
    """
    if isinstance(eval_dataset, dict):
        return [(f"eval_dataset[{key!r}]", dataset) for key, dataset in eval_dataset.items()]
    return [("eval_dataset", eval_dataset)]


def check_dataset(name: str, dataset, has_formatters: bool, has_worlds: bool = False) -> None:
    """Before anything is loaded: the dataset has rows, a 'prompt' column (or formatters, or an environment whose
    `reset` writes the task, as in TRL), and no blank prompt."""
    columns = getattr(dataset, "column_names", None)
    if columns is None:  # no dataset, or an iterable one: its rows are checked as they are read
        return
    if isinstance(dataset, Dataset) and len(dataset) == 0:
        raise ValueError(f"MAGRPOTrainer: {name} is empty (0 rows); it needs at least one prompt.")
    if has_worlds or ("prompt" not in columns and has_formatters):
        return  # the environment's `reset`, or the formatters, write the prompts
    if "prompt" not in columns:
        raise ValueError(
            f"MAGRPOTrainer: {name} has no 'prompt' column (columns: {columns}). Add one, or pass "
            "`formatters=` to build each agent's prompt from a row."
        )
    if isinstance(dataset, Dataset) and not has_formatters:
        for index, prompt in enumerate(dataset["prompt"]):
            check_prompt(f"MAGRPOTrainer: {name} row {index}'s 'prompt'", prompt, conversational=True)


def check_dataset_fills_a_step(dataset, args) -> None:
    """A dataset with fewer prompts than one generation takes would give the HF Trainer no step at all (its error,
    "args.max_steps must be set to a positive value", names neither the dataset nor the batch)."""
    if not isinstance(dataset, Dataset) or args.max_steps > 0:
        return
    prompts = args.generation_batch_size // args.num_generations  # over all processes
    if len(dataset) < prompts:
        raise ValueError(
            f"MAGRPOTrainer: train_dataset has {len(dataset)} prompt(s), but one generation takes {prompts} "
            f"(generation_batch_size {args.generation_batch_size} / num_generations {args.num_generations}), so no "
            f"step would run. Set per_device_train_batch_size={args.num_generations} (one prompt per step, as CoMLRL "
            "trains) with gradient_accumulation_steps=1, or add prompts."
        )


def check_column_names(columns, reserved) -> None:
    """A dataset column named like a keyword the trainer passes would silently replace that value."""
    clashes = sorted(set(columns) & set(reserved))
    if clashes:
        raise ValueError(
            f"MAGRPOTrainer: the dataset column(s) {clashes} have the name of a keyword the trainer passes to the "
            f"reward and the transition ({sorted(reserved)}); rename the column(s)."
        )


@dataclass
class UserFunctions:
    joint_reward: JointReward
    transition: Transition | None
    formatters: list | None


def user_functions(
    args,
    num_agents: int,
    reward_func,
    reward_funcs,
    external_transition,
    formatters,
    train_dataset,
    eval_dataset,
    reward_processor,
    world_rewards: list | None = None,
    has_worlds: bool = False,
) -> UserFunctions:
    """The reward functions, the transition and the formatters, checked against the team and the datasets before
    anything is loaded: signatures, counts, columns, turns. `world_rewards` are the environments' `get_reward` columns,
    after the user's functions (weight 1 unless `reward_weights` gives one for them too: `rewards.resolve_weights`)."""
    if reward_func is not None and reward_funcs is not None:
        raise ValueError("MAGRPOTrainer: pass `reward_func` or `reward_funcs`, not both.")
    funcs = reward_funcs if reward_funcs is not None else reward_func
    funcs = [] if funcs is None else list(funcs) if isinstance(funcs, (list, tuple)) else [funcs]
    weights = resolve_weights(args.reward_weights, [reward_name(f) for f in funcs], world_rewards or [])
    funcs += [each_agent(f) if f.per_agent_reward else f for f in world_rewards or []]
    named = [("train_dataset", train_dataset), *named_eval_datasets(eval_dataset)]
    columns = [c for _, d in named for c in (getattr(d, "column_names", None) or [])]
    columns = [c for c in columns if c != "prompt"]
    check_column_names(columns, {*JointReward.KEYWORDS, *Transition.REQUIRED, *Transition.HISTORY})
    joint_reward = JointReward(
        funcs,
        weights,
        num_agents,
        columns,
        reward_processor,
        args.agent_reward_aggregation,
        args.multi_objective_aggregation,
    )
    if args.team_reward_weight != 1.0 and not joint_reward.gives_own_rewards:
        raise ValueError(
            f"MAGRPOConfig: team_reward_weight={args.team_reward_weight} mixes each agent's own reward into the team's, "
            f"but none of the reward functions {joint_reward.names} gives one: each is joint. Add a reward in TRL's "
            "per-agent convention (`f(completions, **kwargs)`, or wrap it in `trl_multiagent.per_agent`), set "
            "`per_agent_reward = True` on an environment class whose get_reward() returns one value per agent, or "
            "leave team_reward_weight at 1.0."
        )
    if args.agent_learning_rates is not None and len(args.agent_learning_rates) != num_agents:
        raise ValueError(
            f"MAGRPOConfig: agent_learning_rates has {len(args.agent_learning_rates)} rates for a team of {num_agents} "
            f"agents; give one per agent (got {list(args.agent_learning_rates)})."
        )
    if callable(formatters):  # one formatter serves every agent
        formatters = [formatters] * num_agents
    if formatters is not None and len(formatters) != num_agents:
        raise ValueError(
            f"MAGRPOTrainer got {len(formatters)} formatters for {num_agents} agents; pass one per agent."
        )
    for name, dataset in named:
        check_dataset(name, dataset, formatters is not None, has_worlds)
    if train_dataset is not None and next(iter(train_dataset), None) is None:  # an iterable one: read its first row
        raise ValueError("MAGRPOTrainer: train_dataset is empty (no row); it needs at least one prompt.")
    check_dataset_fills_a_step(train_dataset, args)
    if args.num_turns > 1 and external_transition is None:
        raise ValueError(
            f"MAGRPOTrainer: num_turns={args.num_turns} needs `external_transition` to write the next prompts."
        )
    if args.num_turns == 1 and external_transition is not None:
        logger.warning_once(
            f"MAGRPOTrainer: external_transition {callable_name(external_transition)!r} is never called with "
            "num_turns=1: it writes the prompts of turn 2 and later. Set `num_turns` above 1 to use it."
        )
    conversational = _is_conversational_dataset(train_dataset if train_dataset is not None else eval_dataset)
    transition = (
        Transition(external_transition, num_agents, conversational, columns)
        if external_transition is not None
        else None
    )
    return UserFunctions(joint_reward, transition, list(formatters) if formatters is not None else None)


def check_first_rows(environment, train_dataset, eval_dataset, args, acts: bool = False) -> None:
    """The first rows' prompts (formatters, chat templates; chat messages when the agents act: `acts`), and one
    placeholder call of the user's functions."""
    if isinstance(eval_dataset, (Dataset, IterableDataset)):
        eval_row = next(iter(eval_dataset), None)
        if eval_row is not None:
            check_acting_prompts(environment.first_prompts(eval_row), acts)
    if train_dataset is None:
        return
    first_row = next(iter(train_dataset))  # `user_functions` refused an empty one
    prompts = environment.first_prompts(first_row)
    check_acting_prompts(prompts, acts)
    if args.check_functions_before_training:
        environment.check_functions(first_row, prompts, args.num_turns)


def check_acting_prompts(prompts: list, acts: bool) -> None:
    """Tool calls are parsed from chat turns (TRL's `parse_response`): agents with tools need chat prompts."""
    if acts and not all(is_conversational({"prompt": p}) for p in prompts):
        raise ValueError(
            "MAGRPOTrainer: `tools` and `environment_factory` need chat prompts (lists of messages), as in TRL: tool "
            "calls are read from the assistant's turn and results come back as tool messages. The first prompts are "
            f"plain text ({_short(prompts[0], 80)}); write the dataset's 'prompt' as "
            '[{"role": "user", "content": ...}], or return messages from `formatters`.'
        )


def placeholder_dataset(args, worlds) -> Dataset:
    """TRL's rule when an environment owns the data (no `train_dataset`): `max_steps` sets the length, and rows of
    empty chat prompts, one generation's worth, drive the loop; each root's `reset` writes its task."""
    if worlds.routed:
        raise ValueError(
            "MAGRPOTrainer: a dict `environment_factory` (several environments) requires a `train_dataset` with an "
            "'environment' column to route each row to its environment, as in TRL. Pass one, or a single factory."
        )
    if args.max_steps <= 0:
        raise ValueError(
            "MAGRPOTrainer: without a `train_dataset` (the environment owns the data and `reset()` writes the "
            "prompt), `max_steps` sets the training length: set MAGRPOConfig(max_steps=...), as TRL asks."
        )
    rows = max(args.generation_batch_size // args.num_generations, 1)
    return Dataset.from_dict({"prompt": [EMPTY_CHAT] * rows})


def check_joint_mode_for_worlds(args, worlds) -> None:
    """A world is acted on by the agents of one joint action in turn; `cross` pairs each completion with K^(N-1)
    joint actions, whose worlds differ, so one completion would have acted on several worlds."""
    if worlds is not None and args.joint_mode != "aligned":
        raise ValueError(
            f"MAGRPOTrainer: environment_factory needs joint_mode='aligned' (got {args.joint_mode!r}): in a joint "
            "action every agent acts on that joint action's world, and with 'cross' each completion would belong to "
            "several joint actions, hence several worlds. Set MAGRPOConfig(joint_mode='aligned'), or give the agents "
            "plain `tools=` (functions without a shared world), which work with 'cross'."
        )


def _is_conversational_dataset(dataset) -> bool:
    if dataset is None or "prompt" not in (getattr(dataset, "column_names", None) or []):
        return False
    first = next(iter(dataset), None)
    return first is not None and is_conversational(first)


@dataclass
class PreparedInputs:
    """`MAGRPOTrainer`'s arguments, checked and resolved, before any model is loaded."""

    args: object  # the MAGRPOConfig to train with (a copy when CoMLRL keywords changed it)
    train_dataset: object  # as given, or TRL's placeholder rows when an environment owns the data
    eval_dataset: object
    plan: TeamPlan
    agent_init_kwargs: dict | None  # the agents' `from_pretrained` keywords (with `quantization_config`)
    grows_embeddings: bool  # tokens were added to the tokenizers: each agent's embeddings grow to its tokenizer
    tool_calling: ToolCalling | None  # the agents' tools (`tools=`, `environment_factory=`), or None
    eval_metrics: list  # `(tree, rows, num_turns) -> metrics` callables run on each evaluation rollout
    callbacks: list  # added once the Trainer exists
    tokenizers: list  # one per agent, loaded (with the special tokens added)
    environment: TeamEnvironment  # what the rollout calls


def prepare(
    args,
    *,
    agents,
    model,
    num_agents,
    tokenizer,
    reward_func,
    reward_funcs,
    external_transition,
    formatters,
    train_dataset,
    eval_dataset,
    peft_config,
    quantization_config,
    tools,
    rollout_func,
    environment_factory,
    comlrl_arguments: dict,
    optimizers=(None, None),
) -> PreparedInputs:
    """Check and resolve `MAGRPOTrainer`'s arguments in the order a user meets the problems: the config (again: a
    field may have been set after it was built), GRPOTrainer's own arguments, CoMLRL's, the team, the user's functions
    and datasets; then load the tokenizers (small: the first prompts need them, chat messages a chat template) and
    check the first rows' prompts and one placeholder call of the user's functions. No model is loaded yet."""
    from .config import MAGRPOConfig  # the config imports nothing of the trainer's

    args = args if args is not None else MAGRPOConfig("MAGRPO")
    if not isinstance(args, MAGRPOConfig):
        raise TypeError(f"MAGRPOTrainer needs a MAGRPOConfig as `args`, got {type(args).__name__}.")
    args.check()
    check_grpo_arguments(rollout_func=rollout_func)
    resolved = comlrl.trainer_arguments(
        comlrl_arguments, args, agents=agents, model=model, num_agents=num_agents, eval_dataset=eval_dataset
    )
    args, eval_dataset = resolved.args, resolved.eval_dataset
    check_agent_learning_rates(args, optimizers)
    plan = plan_team(
        agents, resolved.model, resolved.num_agents, tokenizer, peft_config, args.trainable_agents, args.num_agents
    )
    check_agent_reward_aggregation(args.agent_reward_aggregation, plan.num_agents)
    # as GRPOTrainer: `trust_remote_code` reaches every load, unless `model_init_kwargs` sets it
    init_kwargs = {"trust_remote_code": args.trust_remote_code, **(args.model_init_kwargs or {})}
    agent_init_kwargs = quantized_model_init_kwargs(quantization_config, init_kwargs, plan.specs)
    if args.use_vllm:
        check_vllm_team(args, plan.num_agents, plan.shared_base, lora=plan.peft_configs is not None)
    worlds = (
        Worlds(environment_factory, plan.num_agents, args.tool_call_timeout)
        if environment_factory is not None
        else None
    )
    check_joint_mode_for_worlds(args, worlds)
    if train_dataset is None and worlds is not None:
        train_dataset = placeholder_dataset(args, worlds)
    if train_dataset is None:
        raise ValueError(
            "MAGRPOTrainer: `train_dataset` is required unless an `environment_factory` is provided (its `reset` then "
            "writes each prompt, and `max_steps` sets the length)."
        )
    functions = user_functions(
        args,
        plan.num_agents,
        reward_func,
        reward_funcs,
        external_transition,
        formatters,
        train_dataset,
        eval_dataset,
        resolved.reward_processor,
        worlds.reward_funcs if worlds is not None else None,
        has_worlds=worlds is not None,
    )
    tokenizers = load_tokenizers(plan, args.trust_remote_code)
    resolved.add_special_tokens(tokenizers)
    tool_calling = None
    for name in ("max_tool_calling_iterations", "tool_call_timeout"):
        if not tools and worlds is None and getattr(args, name) is not None:
            logger.warning_once(
                f"MAGRPOTrainer: {name}={getattr(args, name)} has no effect: no agent has tools. Pass `tools=` or "
                "`environment_factory=` (docs: Agents that act)."
            )
    if tools or worlds is not None:  # as TRL, `tools=[]` is no tools
        tool_calling = ToolCalling(
            tools,
            worlds,
            tokenizers,
            max_iterations=args.max_tool_calling_iterations,
            max_completion_length=args.max_completion_length,
            chat_template_kwargs=args.chat_template_kwargs,
            timeout=args.tool_call_timeout,
        )
    later_turn_format = resolved.later_turn_formatter(functions.formatters)
    environment = TeamEnvironment(
        functions.joint_reward, functions.transition, functions.formatters, later_turn_format, tokenizers, worlds
    )
    check_first_rows(environment, train_dataset, eval_dataset, args, acts=tool_calling is not None)
    say_early_termination(args.num_turns, args.early_termination_threshold)
    learning_signal = LearningSignalCallback(
        args.num_turns, plan.trainable, args.early_termination_threshold, args.mask_truncated_completions
    )
    return PreparedInputs(
        args=args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        plan=plan,
        agent_init_kwargs=agent_init_kwargs,
        grows_embeddings=bool(resolved.special_tokens),
        tool_calling=tool_calling,
        eval_metrics=resolved.eval_metrics,
        callbacks=[*resolved.callbacks, learning_signal],
        tokenizers=tokenizers,
        environment=environment,
    )
