"""CoMLRL 1.4.3's `CentralizedMAGRPOConfig` and `CentralizedMAGRPOTrainer`: one joint policy writes every role's
answer, trained with MAGRPO on the task's joint reward.

On the core this is a team of one agent: its prompt is the adapter's joint prompt (built from each role's formatted
prompt), its completion the joint answer, and the joint reward splits that answer into the roles' answers
(`centralized_adapter.parse_completion`) and calls the user's reward with them, as CoMLRL calls a reward of that many
agents. The update is the one agent's MAGRPO update on its whole joint answer, as CoMLRL's centralized loss is.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...rewards import comlrl_call
from ..preference.centralized import CentralizedComparatorParseError
from .magrpo import MAGRPOConfig, MAGRPOTrainer


@dataclass
class CentralizedMAGRPOConfig(MAGRPOConfig):
    """CoMLRL 1.4.3's `CentralizedMAGRPOConfig`: the face's `MAGRPOConfig` with `num_turns=1` and
    `collaboration_mode="centralized"`, both required (CoMLRL supports one turn only). `num_agents` is the number of
    roles the joint policy answers for; the team trained is one model."""

    num_turns: int = field(default=1, metadata={"help": "Number of turns: 1, the only one supported (CoMLRL)."})
    collaboration_mode: str = field(
        default="centralized",
        metadata={"help": "'centralized', the only mode: one policy writes every role's answer."},
    )

    def __post_init__(self, train_batch_size: int | None, eval_batch_size: int | None):
        super().__post_init__(train_batch_size, eval_batch_size)
        if self.collaboration_mode != "centralized":
            raise ValueError(
                "CentralizedMAGRPOConfig requires centralized collaboration: collaboration_mode must be 'centralized', "
                f"got {self.collaboration_mode!r}."
            )
        if self.num_turns != 1:
            raise ValueError(
                f"Centralized MAGRPO currently supports num_turns=1 only, got num_turns={self.num_turns}."
            )
        devices = self.reference_devices
        if self.reference_kl_enabled and isinstance(devices, (list, tuple)) and len(devices) != 1:
            raise ValueError(
                f"CentralizedMAGRPOConfig: reference_devices={list(devices)} has {len(devices)} entries; the one joint "
                "policy has one reference (CoMLRL: one device, or a list of one)."
            )


class CentralizedMAGRPOTrainer(MAGRPOTrainer):
    """CoMLRL 1.4.3's `CentralizedMAGRPOTrainer`: one joint policy (`agents=[model]` or `agent_model=`) trained with
    MAGRPO; role answers are split from its completions only for the reward and for evaluation.

    Arguments are CoMLRL's, by keyword: `centralized_adapter` (`build_prompt(item, role_prompts)` and
    `parse_completion(completion, item, num_roles)`, e.g. `TaggedCentralizedComparatorAdapter()`), `num_agents` (the
    number of roles, equal to `args.num_agents`), `agents` (one model), `tokenizer` (one), `reward_func` (the task's
    joint reward, called with each role's answer as CoMLRL calls a reward of `num_agents` agents), `formatters` (each
    role's prompt, given to the adapter), `args` (a `CentralizedMAGRPOConfig`), and any other argument of
    `MAGRPOTrainer`. A completion the adapter cannot parse (`CentralizedComparatorParseError`) gives every role "".

    What CoMLRL's attributes hold: `num_agents` is 1 (the team trained) and `args.num_agents` the role count;
    `reward_func` is the joint reward over the split answers (`centralized_collaboration`, with the user's
    `reward_range`); `eval_logger` receives each role's answers, split.
    """

    default_config_cls = CentralizedMAGRPOConfig

    def __init__(
        self,
        *,
        centralized_adapter,
        num_agents: int = 2,
        agents: Sequence | None = None,
        tokenizer=None,
        reward_func: Callable | None = None,
        formatters: Callable | Sequence[Callable] | None = None,
        args: CentralizedMAGRPOConfig | None = None,
        **kwargs,
    ):
        config = args if args is not None else self.default_config_cls()
        if getattr(config, "collaboration_mode", None) != "centralized":
            raise ValueError(
                "CentralizedMAGRPOTrainer requires centralized configuration: args must be a CentralizedMAGRPOConfig "
                f"(collaboration_mode='centralized'), got {type(config).__name__}."
            )
        if config.num_turns != 1:
            raise ValueError(
                f"Centralized MAGRPO currently supports num_turns=1 only, got args.num_turns={config.num_turns}."
            )
        if num_agents != config.num_agents:
            raise ValueError(
                f"CentralizedMAGRPOTrainer: num_agents must match args.num_agents (the role count): got num_agents="
                f"{num_agents}, args.num_agents={config.num_agents}."
            )
        if agents is not None and len(agents) != 1:
            raise ValueError(
                f"Centralized collaboration requires exactly one actor model (agents=[model]), got {len(agents)}."
            )
        if isinstance(tokenizer, (list, tuple)) and len(tokenizer) != 1:
            raise ValueError(f"Centralized collaboration requires one actor tokenizer, got {len(tokenizer)}.")
        if not callable(reward_func):
            raise ValueError(f"CentralizedMAGRPOTrainer: reward_func must be callable, got {reward_func!r}.")
        for name in ("build_prompt", "parse_completion"):
            if not callable(getattr(centralized_adapter, name, None)):
                raise TypeError(
                    f"centralized_adapter.{name} must be callable (got {type(centralized_adapter).__name__}); "
                    "TaggedCentralizedComparatorAdapter() is CoMLRL's."
                )
        collaboration = CentralizedCollaboration(centralized_adapter, formatters, reward_func, num_agents)
        self.centralized_collaboration = collaboration
        eval_logger = kwargs.pop("eval_logger", None)
        super().__init__(
            agents=agents,
            tokenizer=tokenizer,
            num_agents=1,
            args=config,
            reward_func=collaboration,
            formatters=collaboration.build_prompt,
            eval_logger=collaboration.role_eval_logger(eval_logger) if eval_logger is not None else None,
            **kwargs,
        )
        self.eval_logger = eval_logger  # the user's, as given (it receives the split answers)
        self.args.num_agents = num_agents  # CoMLRL keeps the role count here; the team (`num_agents`) is one model


class CentralizedCollaboration:
    """The joint text kept for learning, split into the roles' answers only for the task's reward and evaluation.

    `build_prompt(item)` is the joint policy's prompt; calling it scores joint completions (CoMLRL's reward call
    with one completion list: `collaboration([text], batch_items=[row], prompts=...)`)."""

    def __init__(self, adapter, formatters, reward_func: Callable, num_roles: int):
        self.adapter, self.num_roles = adapter, num_roles
        self.formatters = role_formatters(formatters, num_roles)
        self.reward_func = reward_func
        self.reward_range = declared_reward_range(reward_func)
        self._role_reward = comlrl_call(reward_func, num_roles)

    def build_prompt(self, item: dict[str, Any]) -> str:
        prompt = self.adapter.build_prompt(item, [formatter(item) for formatter in self.formatters])
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError(f"Centralized adapter must build a non-empty prompt, got {prompt!r}.")
        return prompt

    def split(self, completion: str, item: dict[str, Any]) -> list[str]:
        """Each role's answer in `completion` (all "" when the adapter cannot parse it)."""
        try:
            outputs = self.adapter.parse_completion(completion, item, self.num_roles)
        except CentralizedComparatorParseError:
            outputs = [""] * self.num_roles
        if isinstance(outputs, (str, bytes)):
            raise TypeError(f"Centralized adapter must return a sequence of strings, got {outputs!r}.")
        outputs = list(outputs)
        if len(outputs) != self.num_roles:
            raise ValueError(f"Centralized adapter must return exactly {self.num_roles} outputs, got {len(outputs)}.")
        if not all(isinstance(output, str) for output in outputs):
            raise TypeError(f"Centralized adapter outputs must all be strings, got {outputs!r}.")
        return outputs

    def __call__(self, completions, *, prompts=None, batch_items=None) -> list[float]:
        del prompts  # the roles' reward gets role 0's prompt, as in CoMLRL
        if not batch_items:
            raise ValueError("Centralized task rewards require batch_items.")
        if len(batch_items) not in {1, len(completions)}:
            raise ValueError(
                f"Centralized completions ({len(completions)}) must align with batch_items ({len(batch_items)})."
            )
        rewards = []
        for index, completion in enumerate(completions):
            item = batch_items[0] if len(batch_items) == 1 else batch_items[index]
            roles = self.split(completion, item)
            values = self._role_reward(
                *([answer] for answer in roles), prompts=[self.formatters[0](item)], rows=[item]
            )
            if len(values) != 1:
                raise ValueError(f"Centralized task reward must return one joint reward, got {len(values)}.")
            rewards.append(values[0])
        return rewards

    def split_eval(self, joint_turns: list, items: Sequence[dict[str, Any]]) -> list:
        """`[agent][item][turn]` joint answers of the one policy as `[role][item][turn]` role answers."""
        if len(joint_turns) != 1 or len(joint_turns[0]) != len(items):
            raise ValueError("Centralized evaluation outputs must align with items.")
        outputs = [[] for _ in range(self.num_roles)]
        for turns, item in zip(joint_turns[0], items, strict=True):
            parsed = [self.split(completion, item) for completion in turns]
            for role in range(self.num_roles):
                outputs[role].append([row[role] for row in parsed])
        return outputs

    def role_eval_logger(self, eval_logger: Callable) -> Callable:
        """`eval_logger` given each role's answers (`split_eval`) instead of the joint ones."""

        def role_eval_logger(*, agent_completions_turns, batch_items, **kwargs):
            roles = self.split_eval(agent_completions_turns, batch_items)
            return eval_logger(agent_completions_turns=roles, batch_items=batch_items, **kwargs)

        return role_eval_logger


def role_formatters(formatters, num_roles: int) -> list[Callable[[dict], str]]:
    """Each role's formatter, as CoMLRL builds them: None gives the row's `prompt`, one callable serves every role, a
    sequence has one per role."""
    if formatters is None:
        return [_row_prompt] * num_roles
    if callable(formatters):
        return [formatters] * num_roles
    if isinstance(formatters, Sequence) and not isinstance(formatters, (str, bytes)):
        if len(formatters) != num_roles:
            raise ValueError(
                f"Number of formatters must match num_agents when providing a sequence: got {len(formatters)} "
                f"formatters for {num_roles} roles."
            )
        return list(formatters)
    raise ValueError(f"formatters must be None, a callable, or a sequence of callables, got {formatters!r}.")


def _row_prompt(item: dict[str, Any]) -> str:
    return item.get("prompt", "")


def declared_reward_range(reward_func: Callable) -> tuple[float, float] | None:
    """The `reward_range` a reward declares (CoMLRL's `set_reward_range`), checked: two finite numbers, min < max."""
    reward_range = getattr(reward_func, "reward_range", None)
    if reward_range is None:
        return None
    if isinstance(reward_range, (str, bytes)) or not isinstance(reward_range, Sequence) or len(reward_range) != 2:
        raise ValueError(
            f"reward_func.reward_range must be a two-item sequence: (minimum, maximum), got {reward_range!r}."
        )
    minimum, maximum = (float(value) for value in reward_range)
    if not (math.isfinite(minimum) and math.isfinite(maximum)):
        raise ValueError(f"reward_func.reward_range values must be finite, got {reward_range!r}.")
    if minimum >= maximum:
        raise ValueError(f"reward_func.reward_range minimum must be less than maximum, got {reward_range!r}.")
    return minimum, maximum
