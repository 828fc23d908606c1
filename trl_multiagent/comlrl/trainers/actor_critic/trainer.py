"""CoMLRL 1.4.3's actor-critic trainers, `IACTrainer` and `MAACTrainer`, on the face's `MAGRPOTrainer` (so on TRL's
core): CoMLRL's arguments in its order; the critics built from `critic_model`/`critics` as CoMLRL builds them
(`trl_multiagent.critic`); the actors' advantages are the critics' one-step TD advantages, and the critics learn with
their own AdamW (docs/critics.md)."""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
from accelerate.utils import gather_object
from transformers import AutoModelForCausalLM, PreTrainedModel
from transformers.utils import logging

from ....critic.learner import CriticModel, CriticSettings, CriticStep, TeamCritic, completion_table
from ...trainer import MAGRPOTrainer
from .config import ActorCriticConfig, IACConfig, MAACConfig


logger = logging.get_logger(__name__)

CRITICS_NAME = "critics.pt"  # in each checkpoint and saved model: `TeamCritic.weights()`
CRITIC_OPTIMIZERS_NAME = "critic_optimizers.pt"  # in each checkpoint, beside the actors' optimizer


class ActorCriticTrainer(MAGRPOTrainer):
    """What `IACTrainer` and `MAACTrainer` share: CoMLRL's signature, the critics, CoMLRL's `metrics_callback`, and a
    refusal of what is not built for them yet (DeepSpeed; value heads on the actors in several processes).

    Overrides of the face's `MAGRPOTrainer`: `_advantages` (the critics' TD advantages instead of the group's, and
    the critics' step); `compute_loss` and `create_optimizer` (IAC's value heads on the actors: their value loss joins
    the actors', their parameters the actors' optimizer); `_save` and `_load_from_checkpoint` (the critics' weights),
    `_save_optimizer_and_scheduler` and `_load_optimizer_and_scheduler` (the critics' AdamW states)."""

    default_config_cls = ActorCriticConfig
    centralized = False  # MAAC: one critic for the team
    # Open only within one `compute_loss` with IAC's value heads on the actors: each chunk's value losses, logged once
    _open_value_losses: list | None = None

    def __init__(
        self,
        agent_model: str | PreTrainedModel | None = None,
        critic_model: str | PreTrainedModel | None = None,
        tokenizer=None,
        reward_func: Callable | None = None,
        reward_processor: Callable[[float], float] | None = None,
        formatters: Callable | Sequence[Callable] | None = None,
        args: ActorCriticConfig | None = None,
        train_dataset=None,
        eval_dataset=None,
        model_config: dict[str, Any] | None = None,
        wandb_config: dict[str, Any] | None = None,
        metrics_callback: Callable | None = None,
        external_transition: Callable | None = None,
        agents: Sequence | None = None,
        critics: Sequence | None = None,
        **trl_arguments,
    ):
        name = type(self).__name__
        args = self.default_config_cls() if args is None else args
        if not isinstance(args, self.default_config_cls):
            raise TypeError(
                f"{name} (CoMLRL face) needs `{self.default_config_cls.__name__}` as `args`, got "
                f"{type(args).__module__}.{type(args).__name__}."
            )
        if reward_func is None or not callable(reward_func):
            raise ValueError(f"{name}: reward_func must be a callable.")
        if agent_model is None and agents is None:
            raise ValueError(f"{name}: Either agent_model or agents must be provided (CoMLRL's words).")
        if agents is not None and not isinstance(agents, (str, bytes)) and len(agents) != args.num_agents:
            raise ValueError(
                f"{name}: agents length ({len(agents)}) must match num_agents ({args.num_agents}) (CoMLRL's words): "
                f"num_agents is the config's; pass {type(args).__name__}(num_agents={len(agents)}, ...)."
            )
        shared = not getattr(args, "use_separate_critic", True)  # IAC's value heads on the actors' backbones
        if shared and (critics is not None or critic_model is not None):
            given = "critic_model" if critic_model is not None else "critics"
            raise ValueError(
                f"{name}: critics can only be provided when use_separate_critic=True (CoMLRL's words): got {given}=. "
                f"Leave {given} out to put a value head on each actor, or set use_separate_critic=True."
            )
        if shared and args.world_size > 1:  # before any model is built
            raise ValueError(
                f"{name}: use_separate_critic=False in several processes is not built yet: the value heads are not "
                "part of the model DDP reduces (docs/critics.md). Use use_separate_critic=True, or one process."
            )
        if agents is None and args.num_agents > 1 and isinstance(agent_model, PreTrainedModel):
            raise ValueError(
                f"{name}: Multi-agent {args.algorithm} requires `agent_model` to be a pretrained identifier string."
            )
        if agents is not None and tokenizer is None:
            raise ValueError(f"{name}: Tokenizer must be provided when using agents.")
        if args.num_turns > 1 and external_transition is None:
            raise ValueError(f"{name}: Multi-turn {args.algorithm} requires an external_transition.")
        if metrics_callback is not None and not callable(metrics_callback):
            raise TypeError(f"{name}: metrics_callback must be a callable, got {metrics_callback!r}.")
        if shared and any(part is not None for part in trl_arguments.get("optimizers", ())):
            raise ValueError(
                f"{name}: use_separate_critic=False with optimizers=: the value heads join the actors' optimizer, "
                "which the trainer makes; leave optimizers out, or use_separate_critic=True."
            )
        if shared and trl_arguments.get("peft_config") is not None:
            raise ValueError(
                f"{name}: use_separate_critic=False with peft_config: value heads on adapters are not built yet; "
                "use_separate_critic=True with a critic_model gives each agent a critic of its own (docs/critics.md)."
            )
        sources = (
            [] if shared else critic_sources(name, critic_model, critics, 1 if self.centralized else args.num_agents)
        )
        model_config = dict(model_config or {})
        critic_config = {key: model_config.pop(key) for key in CRITIC_MODEL_CONFIG if key in model_config}
        args = copy.copy(args)
        # The critic's TD targets take `discount`; the logged returns stay CoMLRL's undiscounted sums
        self._critic_discount, args.discount = args.discount, 1.0
        super().__init__(
            agent_model=agent_model,
            agents=agents,
            num_agents=args.num_agents,
            tokenizer=tokenizer,
            model_config=model_config,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            reward_func=reward_func,
            reward_processor=reward_processor,
            formatters=formatters,
            external_transition=external_transition,
            wandb_config=wandb_config,
            args=args,
            **trl_arguments,
        )
        self.metrics_callback = metrics_callback
        models = [load_critic(source, critic_loading_keywords(model_config, critic_config)) for source in sources]
        settings = CriticSettings(
            centralized=self.centralized,
            critic_type=self.args.critic_type,
            discount=self._critic_discount,
            normalize=self.args.advantage_normalization,
            value_loss_coef=self.args.value_loss_coef,
            learning_rate=self.args.critic_learning_rate,
            batch_size=int(self.args.comlrl_batch_sizes["train_batch_size"]),
            shared=shared,
            value_clip_range=getattr(self.args, "value_clip_range", None) if shared else None,
        )
        if shared:  # each agent's own model is its critic's backbone, with a head of `value_head_hidden_dim`
            models = [self.team.agent(agent) for agent in range(self.num_agents)]
        heads = self.args.value_head_hidden_dim if shared else self._head_hidden_dim(critic_config)
        critic_models = [CriticModel(m, heads) for m in models]
        for agent, critic in enumerate(critic_models if not (self.centralized or shared) else []):
            rows = self.agents[agent].get_input_embeddings().num_embeddings
            if not critic.reads(rows):
                raise ValueError(
                    f"{name}: critic {agent} reads agent {agent}'s token ids, as in CoMLRL, but its embeddings have "
                    f"fewer rows than that agent's ({rows}): give agent {agent} a critic of its own family."
                )
        if self.accelerator.num_processes > 1:  # every process's critics start as the first process's
            for critic in critic_models:
                for tensor in [*critic.parameters(), *critic.buffers()]:
                    torch.distributed.broadcast(tensor.data, src=0)
        self.critic = TeamCritic(
            critic_models,
            settings,
            self.num_agents,
            joint_tokenizer=self.tokenizers[0],
            device=self.accelerator.device,
        )

    def _head_hidden_dim(self, model_config) -> int | None:
        return None

    def _advantages(self, tree, rows, mode):
        """The critics' TD advantages in place of the group's (the returns and credited rewards the metrics log are
        still `credit.assign`'s); in training the critics then learn, and CoMLRL's `metrics_callback` gets each row's
        samples (`RolloutRecord`), its float values averaged over the rows and logged under their own keys. With
        value heads on the actors, each row also carries its TD target and rollout-time value (`_team_loss`)."""
        credit = super()._advantages(tree, rows, mode)
        # with several processes, every process's samples: one standardisation, the same critic steps everywhere
        step = self.critic.step(
            tree, train=mode == "train", log=partial(self._log_metrics, mode), gather=gather_object
        )
        columns = dict(credit.columns)
        if self.critic.settings.shared and step.td is not None:
            columns["value_targets"] = completion_table(tree, step.td.targets, self.num_agents)
            columns["old_values"] = completion_table(tree, step.values, self.num_agents)
        if self.metrics_callback is not None and mode == "train" and step.td is not None:
            values: dict[str, list[float]] = {}
            for samples in rollout_records(tree, step, rows):
                extra = self.metrics_callback(samples)
                for key, value in extra.items() if isinstance(extra, dict) else ():
                    try:
                        number = float(value)
                    except (TypeError, ValueError):
                        continue  # as CoMLRL, a value that is not a number is left out
                    values.setdefault(str(key), []).append(number)
            self._log_metrics("train", {key: sum(v) / len(v) for key, v in values.items()})
        return credit._replace(advantages=step.advantages, columns=columns)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """The actors' loss (`MAGRPOTrainer.compute_loss`); with IAC's value heads on the actors, each real row of
        the micro-batch first gets its weight in its agent's value loss (one over the agent's real rows: the loss is
        their mean), which `_team_loss` reads chunk by chunk, and the micro-batch's value loss is logged."""
        if not (self.critic.settings.shared and torch.is_grad_enabled()):
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        for rows in inputs:
            real = rows["is_real"].float()
            rows["value_weight"] = real / real.sum().clamp(min=1.0)
        self._open_value_losses = value_losses = []
        try:
            loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        finally:
            self._open_value_losses = None
        if value_losses:
            scale = self.current_gradient_accumulation_steps  # logged unscaled, as TRL logs its losses
            self._log_metrics("train", {"critic/value_loss": sum(value_losses) * scale / len(self.trainable_agents)})
        return loss

    def _team_loss(self, inputs, weights, policy_losses, forward):
        """The actors' loss of one chunk (`MAGRPOTrainer._team_loss`: TRL's, per agent); with IAC's value heads on the
        actors, plus each trainable agent's value loss on the chunk's real rows, each row weighted by its share of
        the micro-batch (`compute_loss`) and divided by the accumulation steps, as TRL scales its losses: in the
        chunk's backward, into the head and the backbone, as CoMLRL adds the two (`TeamCritic.shared_value_loss`,
        clipped at `value_clip_range`). The value is read from a forward of its own over each row's prompt (V), or
        prompt and answer (Q)."""
        loss = super()._team_loss(inputs, weights, policy_losses, forward)
        if self._open_value_losses is None:  # evaluation, or separate critics
            return loss
        for agent, rows in enumerate(inputs):
            real = rows["is_real"].bool()
            if agent not in self.trainable_agents or not bool(real.any()):
                continue
            value_loss = self.critic.shared_value_loss(
                agent,
                self._value_inputs(rows, real),
                rows["value_targets"][real],
                rows["old_values"][real],
                weights=rows["value_weight"][real],
            )
            value_loss = value_loss / self.current_gradient_accumulation_steps
            self._open_value_losses.append(float(value_loss.detach()))
            loss = loss + value_loss
        return loss

    def _value_inputs(self, rows: dict, real: torch.Tensor) -> list[list[int]]:
        """Each real row's token ids as the rollout's values read them (`TeamCritic.inputs`): the prompt (V), or the
        prompt and the completion (Q), without padding."""
        sequences = []
        for index in real.nonzero().flatten().tolist():
            ids = rows["prompt_ids"][index][rows["prompt_mask"][index].bool()].tolist()
            if self.args.critic_type == "q":
                ids += rows["completion_ids"][index][rows["completion_mask"][index].bool()].tolist()
            sequences.append(ids)
        return sequences

    def create_optimizer(self, model=None):
        """The actors' optimizer (`MAGRPOTrainer.create_optimizer`); with IAC's value heads on the actors' backbones,
        each head joins it at its agent's rate, as CoMLRL's agent optimizer holds the head (weight decay as the
        Trainer's: on weights, not biases)."""
        optimizer = super().create_optimizer(model)
        rates = self.args.agent_learning_rates or [self.args.learning_rate] * self.num_agents
        held = {id(p) for group in optimizer.param_groups for p in group["params"]}
        for agent, head in enumerate(self.critic.shared_heads()):
            if any(id(p) in held for p in head.parameters()):  # a second `train()`: the optimizer holds it already
                continue
            decayed = set(self.get_decay_parameter_names(head))
            named = list(head.named_parameters())
            for decay, params in (
                (self.args.weight_decay, [p for n, p in named if n in decayed]),
                (0.0, [p for n, p in named if n not in decayed]),
            ):
                if params:
                    optimizer.add_param_group({"params": params, "lr": rates[agent], "weight_decay": decay})
        return optimizer

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        """The team (`checkpoint.TeamCheckpointing._save`), then the critics' weights (`CRITICS_NAME`): in every
        checkpoint and in `save_model`'s folder."""
        super()._save(output_dir, state_dict)
        if self.args.should_save:
            folder = output_dir if output_dir is not None else self.args.output_dir
            torch.save(self.critic.weights(), os.path.join(folder, CRITICS_NAME))

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        """The Trainer's (the actors' optimizer and scheduler), then the critics' AdamW states beside them
        (`CRITIC_OPTIMIZERS_NAME`), in each checkpoint."""
        super()._save_optimizer_and_scheduler(output_dir)
        if self.args.should_save:
            torch.save(self.critic.optimizer_states(), os.path.join(output_dir, CRITIC_OPTIMIZERS_NAME))

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model=None) -> None:
        """The team's weights, then the critics', which a checkpoint of this trainer holds."""
        super()._load_from_checkpoint(resume_from_checkpoint, model)
        path = os.path.join(resume_from_checkpoint, CRITICS_NAME)
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"{type(self).__name__}: {resume_from_checkpoint} has no {CRITICS_NAME}: it is not a checkpoint of an "
                "actor-critic trainer, and the critics would start afresh."
            )
        self.critic.load_weights(load_on_cpu(path))

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        """The Trainer's (and the entropy coefficients'), then the critics' AdamW states, where the checkpoint has
        them: as the Trainer's own optimizer file, they are optional (a `save_only_model` checkpoint has none)."""
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None:
            return
        path = os.path.join(checkpoint, CRITIC_OPTIMIZERS_NAME)
        if not os.path.isfile(path):
            logger.warning(
                f"{type(self).__name__}: {checkpoint} has no {CRITIC_OPTIMIZERS_NAME} (saved with save_only_model, or "
                "before training): the critics' optimizers start afresh."
            )
            return
        self.critic.load_optimizer_states(load_on_cpu(path))

    @property
    def critics(self) -> list:
        """The critic models (CoMLRL's `critics`): one per agent (IAC) or one (MAAC); none with IAC's value heads on
        the actors' backbones (`use_separate_critic=False`), as in CoMLRL."""
        return [] if self.critic.settings.shared else self.critic.critics

    @property
    def critic_optimizers(self) -> list:
        """Each critic's AdamW (CoMLRL's IAC `critic_optimizers`)."""
        return self.critic.optimizers


# `model_config`'s keys for the critics (CoMLRL's): the rest is the actors', as the face reads it
CRITIC_MODEL_CONFIG = ("critic_model_kwargs", "critic_value_head_hidden_dim")


def load_on_cpu(path: str):
    """A critics' file of a checkpoint, read onto the CPU (under DDP the process's device may be `cpu:0`, which
    `torch.load` cannot map to); `load_state_dict` then puts each tensor where its parameter is."""
    return torch.load(path, map_location="cpu", weights_only=True)


def critic_loading_keywords(model_config: dict, critic_config: dict) -> dict:
    """The critics' `from_pretrained` keywords, as CoMLRL resolves them: `model_config`'s dtype and attention
    implementation, then its `critic_model_kwargs`."""
    kwargs = {}
    for key in ("torch_dtype", "dtype", "attn_implementation"):
        if model_config.get(key) is not None:
            kwargs["dtype" if key == "torch_dtype" else key] = model_config[key]
    return {**kwargs, **dict(critic_config.get("critic_model_kwargs") or {})}


@dataclass
class RolloutRecord:
    """One agent's sample of one turn, with the fields of CoMLRL's `RolloutSample` that its `metrics_callback` reads:
    tensors of one value, as CoMLRL's; `returns` the undiscounted sum of the rewards from this turn on; `metadata`
    with `turn_idx` (0-based), `generation_idx` and `batch_item`. CoMLRL's token fields are not filled."""

    agent_idx: int
    prompt: Any
    completion: str
    reward: torch.Tensor
    returns: torch.Tensor
    old_value: torch.Tensor
    advantage: torch.Tensor
    normalized_advantage: torch.Tensor
    metadata: dict = field(default_factory=dict)


def rollout_records(tree, step: CriticStep, rows: list) -> list[list[RolloutRecord]]:
    """Each row's samples (agent-major, then turn), as CoMLRL hands `metrics_callback` one item's rollouts."""
    children, undiscounted = tree.children(), {}
    for a in reversed(range(len(tree.joint_actions))):  # a child's id is larger than its parent's
        kids = children[a]
        undiscounted[a] = tree.joint_actions[a].reward + (
            sum(undiscounted[c] for c in kids) / len(kids) if kids else 0
        )
    values, td = step.values, step.td
    per_row: dict[int, list[RolloutRecord]] = {}
    for agent in range(step.advantages.shape[1]):
        for a, action in enumerate(tree.joint_actions):
            node = tree.nodes[action.node]
            value = values[a] if values.dim() == 1 else values[agent, a]
            target = td.targets[a] if td.targets.dim() == 1 else td.targets[agent, a]
            advantage = td.advantages[a] if td.advantages.dim() == 1 else td.advantages[agent, a]
            per_row.setdefault(node.row, []).append(
                RolloutRecord(
                    agent_idx=agent,
                    prompt=tree.action_prompts(a)[agent],
                    completion=tree.answers(a)[agent],
                    reward=torch.tensor([action.reward]),
                    returns=torch.tensor([undiscounted[a]]),
                    old_value=value.view(1).clone(),
                    advantage=(target - value).view(1).clone(),
                    normalized_advantage=advantage.view(1).clone(),
                    metadata={
                        "turn_idx": node.turn - 1,
                        "generation_idx": action.choice[agent],
                        "batch_item": rows[node.row],
                    },
                )
            )
    return [per_row[row] for row in sorted(per_row)]


def critic_sources(name: str, critic_model, critics, count: int) -> list:
    """The critics to build, as CoMLRL resolves them: `critics` (one each), or `critic_model` for each. A model in
    memory given as `critic_model` would be shared by several critics: refused, naming `critics=`."""
    if critic_model is None and critics is None:
        raise ValueError(f"{name}: Either critic_model or critics must be provided (CoMLRL's words).")
    if critics is not None:
        if isinstance(critics, (str, bytes)) or not isinstance(critics, Sequence):
            raise ValueError(f"{name}: critics must be a list of {count} model(s) or ids, got {critics!r}.")
        if len(critics) != count:
            raise ValueError(f"{name}: critics length ({len(critics)}) must be {count} (CoMLRL's words).")
        if critic_model is not None and not all(isinstance(c, str) and c == critic_model for c in critics):
            raise ValueError(f"{name}: critic_model and critics conflict: {critic_model!r} != {list(critics)!r}.")
        return list(critics)
    if not isinstance(critic_model, str) and count > 1:
        raise ValueError(
            f"{name}: critic_model is a model in memory, which {count} critics would share; pass an id or folder, or "
            "critics=[...] with one model per agent."
        )
    return [critic_model] * count


def load_critic(source, model_kwargs: dict):
    """A critic's backbone: a model given, or loaded from an id or folder with `model_config["critic_model_kwargs"]`."""
    if isinstance(source, CriticModel):
        return source.model
    if isinstance(source, str):
        try:
            return AutoModelForCausalLM.from_pretrained(source, **model_kwargs)
        except (OSError, ValueError) as error:
            raise ValueError(f"Failed to load critic model from identifier '{source}' (CoMLRL's words).") from error
    return source


class IACTrainer(ActorCriticTrainer):
    """CoMLRL 1.4.3's `IACTrainer`: each agent has a critic model of its own (`critic_model` copied per agent, or
    `critics`, one per agent), with a value head (`critic_value_head_hidden_dim`), giving V(h) from the agent's prompt
    or Q(h, a) from its prompt and answer (`critic_type`); with `use_separate_critic=False`, a value head on each
    agent's own model instead (`value_head_hidden_dim`), trained with the actor (`compute_loss`)."""

    default_config_cls = IACConfig
    algorithm_name = _name = "IAC"

    def _head_hidden_dim(self, model_config) -> int | None:
        return self.args.critic_value_head_hidden_dim


class MAACTrainer(ActorCriticTrainer):
    """CoMLRL 1.4.3's `MAACTrainer`: one centralized critic (`critic_model`, or `critics` with one model) over the
    joint prompt, ``[Agent i] <prompt>`` per agent (V), and with a ``[Joint Action]`` block of every agent's answer
    (Q), tokenised with the first agent's tokenizer; its head's hidden layer is `model_config["critic_value_head_hidden_dim"]`,
    as in CoMLRL."""

    default_config_cls = MAACConfig
    algorithm_name = _name = "MAAC"
    centralized = True

    def _head_hidden_dim(self, model_config) -> int | None:
        return model_config.get("critic_value_head_hidden_dim")
