"""CoMLRL 1.4.3's `MAGRPOTrainer` on the TRL face's trainer: CoMLRL's arguments, in its order, translated once into
the TRL face's, and its calls of the user's functions (`comlrl.rewards`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from datasets import Dataset
from transformers.utils import logging

from ..trainer import MAGRPOTrainer as TRLFaceTrainer
from .arguments import (
    Evaluation,
    add_special_tokens,
    check_agent_model_names,
    model_config_keywords,
    wandb_reporting,
)
from .config import MAGRPOConfig, check_late_changes, say_early_termination
from .rewards import comlrl_reward, comlrl_transition


logger = logging.get_logger(__name__)


class MAGRPOTrainer(TRLFaceTrainer):
    """CoMLRL 1.4.3's `MAGRPOTrainer`: its arguments, in its order, and its calls of the user's functions, on the TRL
    face's trainer (a `trl.GRPOTrainer` subclass). What changes from the TRL face's:

    - `__init__` takes CoMLRL's arguments: `agent_model` (an id, copied `num_agents` times: CoMLRL's default is 2) or
      `agents` (one per agent), `tokenizer`, `model_config` (`dtype`, `attn_implementation`, `model_kwargs`,
      `special_tokens`), `reward_func` and `reward_processor`, `formatters`, `external_transition`, `wandb_config`,
      `eval_logger`/`eval_aggregator`, `args` (this face's `MAGRPOConfig`); any of GRPOTrainer's other arguments
      (`peft_config`, `callbacks`, ...) by keyword;
    - the reward is called as CoMLRL calls it, once per joint action (`comlrl.rewards.comlrl_reward`); the transition by
      keyword, with later turns formatted by the formatters (`comlrl_transition`);
    - `_prepare_arguments` adds the tokens of `model_config["special_tokens"]` and the evaluation metrics of
      `eval_logger`.
    """

    points_to_comlrl_face = False  # a refused argument here gets the closest names (`keywords`)

    def __init__(
        self,
        agent_model: str | None = None,
        agents: Sequence | None = None,
        num_agents: int = 2,
        tokenizer=None,
        model_config: dict[str, Any] | None = None,
        train_dataset=None,
        eval_dataset=None,
        reward_func: Callable | None = None,
        reward_processor: Callable[[float], float] | None = None,
        formatters: Callable | Sequence[Callable] | None = None,
        external_transition: Callable | None = None,
        wandb_config: dict[str, Any] | None = None,
        eval_logger: Callable | None = None,
        eval_aggregator: Callable | None = None,
        args: MAGRPOConfig | None = None,
        dataset_type: str | None = None,
        **trl_arguments,
    ):
        args = MAGRPOConfig() if args is None else args
        if not isinstance(args, MAGRPOConfig):
            raise TypeError(
                f"MAGRPOTrainer (CoMLRL face) needs `trl_multiagent.comlrl.MAGRPOConfig` as `args`, got "
                f"{type(args).__module__}.{type(args).__name__}."
            )
        args = check_late_changes(args)  # a copy: the caller's config stays as it was
        say_early_termination(args)
        model, count = _team(agent_model, agents, num_agents)
        args.num_agents = count
        if reward_func is None or not callable(reward_func):
            raise ValueError(f"MAGRPOTrainer: reward_func must be a callable, got {reward_func!r}.")
        if reward_processor is not None and not callable(reward_processor):
            raise TypeError(
                f"MAGRPOTrainer: reward_processor must be a callable float -> float, got {reward_processor!r}."
            )
        self._evaluation = Evaluation.from_arguments(eval_logger, eval_aggregator)
        self._special_tokens = model_config_keywords(model_config, args) if model_config else None
        if dataset_type is not None:  # CoMLRL <= 1.4.2: a label of the wandb run's config
            logger.info_once(
                f"MAGRPOTrainer: dataset_type={dataset_type!r} (CoMLRL <= 1.4.2) labels the wandb run only."
            )
            if wandb_config:
                sections = {**(wandb_config.get("config_sections") or {}), "dataset_type": dataset_type}
                wandb_config = {**wandb_config, "config_sections": sections}
        callbacks = list(trl_arguments.pop("callbacks", None) or [])
        if wandb_config:
            callbacks += wandb_reporting(wandb_config, args)
        train_dataset, eval_dataset = _dataset(train_dataset), _dataset(eval_dataset)
        if eval_dataset is not None and args.eval_num_samples < len(eval_dataset):
            eval_dataset = eval_dataset.select(range(max(args.eval_num_samples, 1)))  # CoMLRL evaluates one at 0
        if eval_dataset is None:  # CoMLRL evaluates only with an eval_dataset
            args.eval_strategy, args.eval_on_start = "no", False
        formatter_list = [formatters] * count if callable(formatters) else formatters
        transition = external_transition
        if external_transition is not None:
            transition = comlrl_transition(external_transition, formatter_list, args.external_prompt_passthrough)
        super().__init__(
            model=model,
            reward_funcs=comlrl_reward(reward_func, count, reward_processor),
            args=args,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=tokenizer,
            callbacks=callbacks or None,
            num_agents=count if isinstance(model, str) else None,
            external_transition=transition,
            formatters=formatter_list,
            **trl_arguments,
        )

    def _prepare_arguments(self, args, **given):
        inputs = super()._prepare_arguments(args, **given)
        if self._special_tokens:
            add_special_tokens(inputs.tokenizers, self._special_tokens)
            inputs.grows_embeddings = True  # each agent's embeddings grow to its tokenizer
        if self._evaluation is not None:
            inputs.eval_metrics.append(self._evaluation)
        return inputs


def _team(agent_model, agents, num_agents: int) -> tuple[Any, int]:
    """CoMLRL's team: `agents` (one per agent), or `agent_model` (an id) copied `num_agents` times; the TRL face's
    `model=` for it, and the team's size."""
    if agent_model is None and agents is None:
        raise ValueError("MAGRPOTrainer: either agent_model or agents must be provided.")
    if agents is not None:
        if agent_model is not None:
            check_agent_model_names(agent_model, agents)  # CoMLRL accepts both when they name the same model
        return list(agents), len(agents)
    if not isinstance(agent_model, str):
        raise ValueError(
            f"MAGRPOTrainer: agent_model should be a string (a model id or folder) to create homogeneous agents, got "
            f"{type(agent_model).__name__}; pass models in memory as agents=[...]."
        )
    return agent_model, num_agents


def _dataset(dataset):
    """A dataset as the core takes it: CoMLRL iterates any sequence of rows, such as a list of dicts."""
    if dataset is None or hasattr(dataset, "column_names"):
        return dataset
    return Dataset.from_list([dict(row) for row in dataset])
