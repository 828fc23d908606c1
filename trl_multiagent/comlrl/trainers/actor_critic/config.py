"""CoMLRL 1.4.3's `IACConfig` and `MAACConfig`: its names and defaults, on the face's `MAGRPOConfig` (so still a
`trl.GRPOConfig`), with one generation per prompt by default, as CoMLRL's actor-critic trains (docs/critics.md, "The
decision")."""

from __future__ import annotations

from dataclasses import dataclass, field

from transformers.utils import logging

from ...config import MAGRPOConfig, _check_one_device, _parallel_mode, core_joint_mode


logger = logging.get_logger(__name__)

# The opening words of GRPOConfig's refusal of `num_generations < 2` (trl/trainer/grpo_config.py), the one error the
# actor-critic configs catch: `tests/test_private_api_contract.py` checks the words and that only the vLLM
# importance-sampling checks come after it.
ONE_GENERATION_REFUSAL = "GRPO requires at least 2 generations per prompt"
CRITIC_TYPES = ("v", "q")
IAC_VALUE_CLIP_RANGE = 0.2  # CoMLRL's default


@dataclass
class ActorCriticConfig(MAGRPOConfig):
    """What CoMLRL's `IACConfig` and `MAACConfig` share: the face's `MAGRPOConfig` with their defaults
    (`num_generations=1`, `num_train_epochs=40`, `logging_steps=1`, `rollout_buffer_size=8`, no top-k) and the
    critic's fields. The actors' update is the face's (docs/from_comlrl.md, "The objective"); the advantages are the
    critic's one-step TD advantages (`trl_multiagent.critic`)."""

    algorithm = "actor-critic"  # the name in messages: "IAC" or "MAAC"

    num_train_epochs: float = field(default=40, metadata={"help": "Total number of training epochs (CoMLRL: 40)."})
    logging_steps: float = field(default=1, metadata={"help": "Log every this many steps (CoMLRL: 1)."})
    num_generations: int | None = field(
        default=1,
        metadata={
            "help": "Completions per agent and node (CoMLRL's actor-critic: 1, its only multi-turn value; the critic "
            "is the baseline, not the group)."
        },
    )
    top_k: int | None = field(default=0, metadata={"help": "Top-k sampling; 0 or None: none (CoMLRL: None)."})
    rollout_buffer_size: int = field(default=8, metadata={"help": "Tree nodes of an agent per generation."})
    discount: float = field(
        default=1.0,
        metadata={"help": "Weight of the next turn's rollout-time value in the critic's one-step TD target."},
    )
    critic_learning_rate: float | None = field(
        default=5e-6, metadata={"help": "The critics' AdamW learning rate (CoMLRL: 5e-6)."}
    )
    value_loss_coef: float = field(default=0.6, metadata={"help": "Weight of the critic's value loss (CoMLRL: 0.6)."})
    critic_type: str = field(
        default="v", metadata={"help": "'v': V(h), from the history; 'q': Q(h, a), from the history and the answer."}
    )
    critic_devices: list[str] | None = field(
        default=None, metadata={"help": "This process's device (or a list, or 'auto'), as agent_devices."}
    )

    def __post_init__(self, train_batch_size: int | None, eval_batch_size: int | None):
        name = type(self).__name__
        if self.top_k is None:  # CoMLRL's "no top-k"; TRL's is 0
            self.top_k = 0
        self.critic_type = str(self.critic_type or "v").lower()
        if self.critic_type not in CRITIC_TYPES:
            raise ValueError(
                f"{name}: critic_type must be one of: 'v', 'q' (CoMLRL's words); got {self.critic_type!r}."
            )
        if self.num_generations is None or self.num_generations < 1:
            raise ValueError(f"{name}: num_generations must be >= 1, got {self.num_generations}.")
        if self.num_turns > 1 and self.num_generations != 1:
            raise ValueError(f"{name}: Multi-turn {self.algorithm} currently supports num_generations == 1 (CoMLRL).")
        if self.critic_learning_rate is None:
            self._critic_learning_rate_default()
        if not self.critic_learning_rate > 0 or not self.value_loss_coef >= 0:
            raise ValueError(
                f"{name}: critic_learning_rate must be > 0 and value_loss_coef >= 0, got {self.critic_learning_rate} "
                f"and {self.value_loss_coef}."
            )
        if not 0.0 <= self.discount <= 1.0:
            raise ValueError(f"{name}: discount must be in [0, 1], got {self.discount}.")
        self._refuse_what_is_not_built()
        if (
            _parallel_mode(self.parallel_training) == "mp"
            and self.critic_devices is None
            and self._needs_critic_devices()
        ):
            raise ValueError(f"{name}: parallel_training='mp' requires explicit critic_devices (CoMLRL's words).")
        if self.critic_devices is not None:
            _check_one_device("critic_devices", self.critic_devices)
        super().__post_init__(train_batch_size, eval_batch_size)

    def _refuse_what_is_not_built(self) -> None:
        """The settings CoMLRL's actor-critic has that are not built here, each refused naming the field; also when
        the trainer is built (`check`), so that one set after the config was built is refused too."""
        name = type(self).__name__
        refused = {
            "use_vllm": (self.use_vllm, "the critics' values are read from transformers models; vLLM is not built "
                         "for critics yet"),
            "joint_mode": (self.num_agents != 1 and core_joint_mode(self) == "cross", "CoMLRL's actor-critic pairs "
                           "completion j of every agent; 'cross' makes a completion part of several joint actions, "
                           "whose targets differ"),
            "reference_kl_enabled": (self.reference_kl_enabled, "CoMLRL's actor-critic subtracts the KL from the "
                                     "reward; that is not built here yet"),
            "advantage_mode": (str(self.advantage_mode).lower() != "mean", f"CoMLRL's {name} has no advantage_mode: "
                               "the critic is the baseline"),
            "branching": (self.branching != "all", "a TD target bootstraps from the node each joint action expanded "
                          "into: every joint action of a node that goes on must be continued"),
            "deepspeed": (self.deepspeed is not None, "the critics are not DeepSpeed engines yet (one process, no "
                          "ZeRO)"),
        }  # fmt: skip
        for field_name, (bad, why) in refused.items():
            if bad:
                raise ValueError(f"{name}: {field_name}={getattr(self, field_name)!r} is refused: {why}.")

    def check(self) -> None:
        super().check()
        self._refuse_what_is_not_built()

    def _critic_learning_rate_default(self) -> None:
        raise ValueError(f"{type(self).__name__}: critic_learning_rate must be a number, got None.")

    def _needs_critic_devices(self) -> bool:
        return True

    def _check_num_generations(self) -> None:
        """One generation per prompt is accepted: the critic, not the group, is the baseline."""
        if self.num_generations is None or self.num_generations < 1:
            raise ValueError(f"{type(self).__name__}: num_generations must be >= 1, got {self.num_generations}.")

    def _grpo_post_init(self) -> None:
        """GRPOConfig's `__post_init__`, accepting `num_generations=1`: GRPOConfig runs every check but the vLLM
        importance-sampling ones before refusing it (`ONE_GENERATION_REFUSAL`); that error alone is caught, and vLLM
        is refused here (docs/critics.md)."""
        try:
            super()._grpo_post_init()
        except ValueError as error:
            if self.num_generations != 1 or not str(error).startswith(ONE_GENERATION_REFUSAL):
                raise


@dataclass
class IACConfig(ActorCriticConfig):
    r"""
    CoMLRL 1.4.3's `IACConfig` (independent actor-critic): each agent has a critic of its own, a separate model with a
    value head, which estimates V(h) or Q(h, a) (`critic_type`). Its names and defaults, on the face's config
    (docs/critics.md has what is built and what is not).

    Parameters:
        critic_learning_rate (`float`, defaults to `5e-6`): each critic's AdamW learning rate; None: `agent_learning_rate`.
        value_loss_coef (`float`, defaults to `0.6`), value_clip_range (`float`, defaults to `0.2`): the value loss's
            weight, and its clip, which CoMLRL applies only to a head on the actor's backbone.
        use_separate_critic (`bool`, defaults to `True`): a critic model per agent; False: a value head on each
            actor's backbone, trained with the actor (its value loss added to the actor's, clipped at
            `value_clip_range`; the head in the actors' optimizer).
        critic_type (`str`, defaults to `"v"`): `"v"` or `"q"`.
        critic_value_head_hidden_dim, value_head_hidden_dim (`int`, *optional*): the critic's (the actor's) value
            head's hidden layer.
        discount (`float`, defaults to `1.0`): the next turn's value's weight in the TD target.
    """

    algorithm = "IAC"

    value_clip_range: float | None = field(
        default=IAC_VALUE_CLIP_RANGE,
        metadata={"help": "Clip of a value head on the actor's backbone (CoMLRL applies none to a separate critic)."},
    )
    use_separate_critic: bool = field(
        default=True, metadata={"help": "A critic model per agent; False: a value head on each actor's backbone."}
    )
    critic_value_head_hidden_dim: int | None = field(
        default=None, metadata={"help": "Hidden layer of the critic's value head (None: a linear head)."}
    )
    value_head_hidden_dim: int | None = field(
        default=None, metadata={"help": "Hidden layer of a value head on the actor (use_separate_critic=False)."}
    )

    def __post_init__(self, train_batch_size: int | None, eval_batch_size: int | None):
        self._check_value_heads()
        if self.value_clip_range not in (None, IAC_VALUE_CLIP_RANGE) and self.use_separate_critic:  # one set, unused
            logger.info_once(
                f"IACConfig: value_clip_range={self.value_clip_range} is not applied: as in CoMLRL, it clips only a "
                "value head on the actor's backbone, and each agent's critic here is a separate model."
            )
        super().__post_init__(train_batch_size, eval_batch_size)

    def check(self) -> None:
        super().check()
        self._check_value_heads()

    def _check_value_heads(self) -> None:
        """The rules of `value_clip_range` and of value heads on the actors (`use_separate_critic=False`); also when
        the trainer is built (`check`), for a field set after the config was built."""
        if self.value_clip_range is not None and not self.value_clip_range >= 0:
            raise ValueError(f"IACConfig: value_clip_range must be >= 0 or None, got {self.value_clip_range}.")
        if not self.use_separate_critic and str(self.critic_type).lower() == "q" and self.mask_truncated_completions:
            raise ValueError(
                "IACConfig: use_separate_critic=False with critic_type='q' and mask_truncated_completions=True: the "
                "head reads Q at each answer's last token, which the mask hides for a truncated answer. Set "
                "mask_truncated_completions=False, or use critic_type='v'."
            )
        if not self.use_separate_critic and self.max_grad_norm:
            raise ValueError(
                f"IACConfig: max_grad_norm={self.max_grad_norm} with use_separate_critic=False: the Trainer clips its "
                "model's gradients, and the value heads on the actors are stepped with them without being part of it. "
                "Set max_grad_norm=0 (CoMLRL's: it clips none), or use_separate_critic=True."
            )

    def _critic_learning_rate_default(self) -> None:
        self.critic_learning_rate = self.agent_learning_rate  # CoMLRL's rule

    def _needs_critic_devices(self) -> bool:
        return self.use_separate_critic


@dataclass
class MAACConfig(ActorCriticConfig):
    r"""
    CoMLRL 1.4.3's `MAACConfig` (multi-agent actor-critic): one centralized critic over the joint prompt (V, the
    default) or the joint prompt and every agent's answer (Q), `critic_type`. Its names and defaults, on the face's
    config (docs/critics.md).

    Parameters:
        critic_learning_rate (`float`, defaults to `5e-6`): the critic's AdamW learning rate.
        value_loss_coef (`float`, defaults to `0.6`): the value loss's weight.
        critic_type (`str`, defaults to `"v"`): `"v"` or `"q"`.
        discount (`float`, defaults to `1.0`): the next turn's value's weight in the TD target.
    """

    algorithm = "MAAC"
