"""`MAGRPOTrainer`'s arguments, checked and resolved before any model is loaded (`prepare`), one job per module:

- `arguments.grpo`: GRPOTrainer's own arguments (the refused `rollout_func`, the settings `GRPOTrainer.__init__` must
  see, `quantization_config`, the reward models);
- `arguments.learning_rates`: `agent_learning_rates` against a given or DeepSpeed optimizer;
- `arguments.functions`: the rewards, the transition and the formatters against the team and the datasets;
- `arguments.datasets`: the datasets' rows, columns and size;
- `arguments.environments`: what `environment_factory` asks of the other arguments;
- `arguments.first_rows`: the first rows' prompts, and one placeholder call of the user's functions.

Config fields are checked by `MAGRPOConfig.__post_init__`, and again here by `MAGRPOConfig.check` for a field set
after the config was built; the rules that need the team's size, here once it is known; the agents and tokenizers in
`team.assembly.plan_team`. The arguments come in TRL's names; the CoMLRL face (`trl_multiagent.comlrl`) translates
its own before they reach `prepare`.
"""

from __future__ import annotations

from dataclasses import dataclass

from transformers.utils import logging

from ..credit.options import CreditRules, rules_of
from ..diagnostics import LearningSignalCallback
from ..environments.worlds import Worlds
from ..generation.vllm_settings import check_vllm_team
from ..rewards.joint import check_agent_reward_aggregation
from ..rollout.task import TeamTask
from ..rollout.tools import ToolCalling
from ..team.assembly import TeamPlan, load_tokenizers, plan_team
from ..team.optimizer import check_rates
from .environments import check_joint_mode_for_worlds, placeholder_dataset
from .first_rows import check_first_rows
from .functions import user_functions
from .grpo import check_grpo_arguments, grpo_trainer_settings, load_reward_models, quantized_model_init_kwargs
from .learning_rates import check_agent_learning_rates


# `MAGRPOTrainer.__init__` calls `prepare`, then these two once the team is loaded; `check_agent_learning_rates` is
# `prepare`'s, public for its tests
__all__ = ["PreparedInputs", "check_agent_learning_rates", "grpo_trainer_settings", "load_reward_models", "prepare"]

logger = logging.get_logger(__name__)


@dataclass
class PreparedInputs:
    """`MAGRPOTrainer`'s arguments, checked and resolved, before any model is loaded."""

    args: object  # the MAGRPOConfig to train with
    train_dataset: object  # as given, or TRL's placeholder rows when an environment owns the data
    eval_dataset: object
    plan: TeamPlan
    agent_init_kwargs: dict | None  # the agents' `from_pretrained` keywords (with `quantization_config`)
    grows_embeddings: bool  # tokens were added to the tokenizers: each agent's embeddings grow to its tokenizer
    tool_calling: ToolCalling | None  # the agents' tools (`tools=`, `environment_factory=`), or None
    callbacks: list  # added once the Trainer exists
    tokenizers: list  # one per agent, loaded (with the special tokens added)
    task: TeamTask  # what the rollout calls
    credit_rules: CreditRules  # the config's credit options as their strategies, for the rollout and `credit.assign`


def prepare(
    args,
    *,
    model,
    num_agents,
    processing_class,
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
    optimizers=(None, None),
) -> PreparedInputs:
    """Check and resolve `MAGRPOTrainer`'s arguments in the order a user meets the problems: the config (again: a
    field may have been set after it was built), GRPOTrainer's own arguments, the team, the user's functions
    and datasets; then load the tokenizers (small: the first prompts need them, chat messages a chat template) and
    check the first rows' prompts and one placeholder call of the user's functions. No model is loaded yet."""
    from ..config import MAGRPOConfig  # the config imports nothing of the trainer's

    args = args if args is not None else MAGRPOConfig("MAGRPO")
    if not isinstance(args, MAGRPOConfig):
        raise TypeError(f"MAGRPOTrainer needs a MAGRPOConfig as `args`, got {type(args).__name__}.")
    args.check()  # the config's rules again: a field may have been set after it was built
    check_grpo_arguments(rollout_func=rollout_func)
    check_agent_learning_rates(args, optimizers)
    plan = plan_team(model, num_agents, processing_class, peft_config, args.trainable_agents, args.num_agents)
    if args.num_agents is None:  # else `args.check()` applied these two with the team's size, `num_agents`
        check_agent_reward_aggregation(args.agent_reward_aggregation, plan.num_agents)
        check_rates(args.agent_learning_rates, plan.num_agents, f"a team of {plan.num_agents} agents")
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
        reward_funcs,
        external_transition,
        formatters,
        train_dataset,
        eval_dataset,
        worlds.reward_funcs if worlds is not None else None,
        has_worlds=worlds is not None,
    )
    tokenizers = load_tokenizers(plan, args.trust_remote_code)
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
    task = TeamTask(functions.joint_reward, functions.transition, functions.formatters, tokenizers, worlds)
    check_first_rows(task, train_dataset, eval_dataset, args, acts=tool_calling is not None)
    learning_signal = LearningSignalCallback(
        args.num_turns, plan.trainable, args.early_termination_threshold, args.mask_truncated_completions
    )
    return PreparedInputs(
        args=args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        plan=plan,
        agent_init_kwargs=agent_init_kwargs,
        grows_embeddings=False,
        tool_calling=tool_calling,
        callbacks=[learning_signal],
        tokenizers=tokenizers,
        task=task,
        credit_rules=rules_of(args),
    )
