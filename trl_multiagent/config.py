"""`MAGRPOConfig`: GRPOConfig plus the multi-agent, multi-turn fields."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from transformers import TrainingArguments
from transformers.utils import logging
from trl import GRPOConfig

from .credit import options as credit_options
from .credit.returns import expanded_per_node, joint_choices
from .devices import has_accelerator
from .generation.vllm_settings import check_vllm_config
from .keywords import KnownKeywords
from .rewards.joint import AGENT_REWARD_AGGREGATIONS, check_agent_reward_aggregation
from .team.optimizer import check_rates
from .update.chunking import check_loss_type


logger = logging.get_logger(__name__)

# The field that turns activation checkpointing on: transformers 5.24 renamed `gradient_checkpointing` (still accepted,
# with a FutureWarning) to `activation_checkpointing`; 5.19 has only the old name.
ACTIVATION_CHECKPOINTING = next(
    name
    for name in ("activation_checkpointing", "gradient_checkpointing")
    if name in TrainingArguments.__dataclass_fields__
)

MULTI_OBJECTIVE_AGGREGATIONS = ("sum_then_normalize", "normalize_then_sum")  # TRL's two


@dataclass
class MAGRPOConfig(KnownKeywords, GRPOConfig):
    r"""
    Configuration for [`MAGRPOTrainer`]: everything [`~trl.GRPOConfig`] has, plus the fields below.

    Each agent writes `num_generations` (K) completions per tree node. A turn's joint answers are scored by the joint
    reward; the transition turns each joint answer into the next turn's prompts.

    Parameters:
        > Parameters that control the team

        num_agents (`int` or `None`, *optional*):
            Team size, for `MAGRPOTrainer(model=...)` (one model copied per agent); `model=[...]` must have this many.
        trainable_agents (`list[int]` or `None`, *optional*):
            Agents that train; the others keep their weights (a fixed partner). `None` trains all.
        agent_learning_rates (`list[float]` or `None`, *optional*):
            One learning rate per agent (Dr. MAS), each agent's parameters in an optimizer group of their own; the
            scheduler scales each as it scales `learning_rate`. `None`: every agent uses `learning_rate`.

        > Parameters that control the data preprocessing

        max_prompt_length (`int` or `None`, *optional*):
            Longest prompt, in tokens, an agent is given; prompts grow over the turns as the transition adds feedback.
            A longer text prompt keeps its last tokens (the newest feedback, and its BOS token); a longer chat prompt
            drops its oldest messages after the first user turn (the task), since cutting tokens out of a chat
            template breaks it. `None` (default): the agent's `max_position_embeddings` (or `vllm_max_model_length`
            when smaller) minus `max_completion_length`, so that no prompt runs past the positions the model was
            trained on. Logged as
            `prompts/truncated` (prompts shortened in the generation batch).

        > Parameters that control the rollout tree

        num_turns (`int`, *optional*, defaults to `1`):
            Number of turns. `num_turns=2` adds a second turn, fed by `external_transition`.
        joint_mode (`str`, *optional*, defaults to `"aligned"`):
            `"aligned"`: the j-th completions of all agents form K joint answers. `"cross"`: every combination,
            K**N joint answers.
        early_termination_threshold (`float` or `None`, *optional*):
            After a turn, a node whose mean joint reward is above this value is not expanded. `None` (default): every
            node goes on to the next turn.
        branching (`str`, *optional*, defaults to `"all"`):
            Which joint answers of a node continue to the next turn: `"all"` (every one: K + K**2 + ... + K**T
            completions per agent and prompt), `"best"` (the one with the highest joint reward, as AT-GRPO: K*T), or
            `"top"` (the `branching_top_m` best). A joint answer that is not continued has the return of its reward
            plus the discounted mean future of its node's continued joint answers, so siblings differ by their own
            reward only (docs/how-a-step-works.md, "Credit options from the peers").
        branching_top_m (`int` or `None`, *optional*):
            With `branching="top"`: how many joint answers of each node continue (`>= 1`).

        > Parameters that control generation

        max_new_tokens (`int` or `None`, *optional*):
            Alias of `max_completion_length`.
        generate_chunk_size (`int` or `None`, *optional*):
            Most rows (prompts times K) of one agent in one `generate` call. A turn with more live nodes runs in
            several calls, a node's K rows always in the same call, in the same order on every process. `None`
            (default): one call per agent per turn. With colocated vLLM engines, the most sequences an engine decodes
            at once (its `max_num_seqs`; vLLM queues the rest of the turn); in server mode the server's own
            `--max_num_seqs` applies, and a warning says so.
        eval_do_sample (`bool`, *optional*, defaults to `True`):
            Evaluation rollouts sample like training (`True`) or decode greedily (`False`). Evaluation runs with
            `eval_dataset` and `eval_strategy`, or `trainer.evaluate()`, and logs `eval_turn_{t}/reward_mean` and
            `eval_turn_{t}/expected_return`; `eval_on_start=True` adds a baseline evaluation before training.
        vllm_server_base_urls (`list[str]` or `None`, *optional*):
            With `use_vllm=True, vllm_mode="server"`: one `trl vllm-serve` URL per agent. `None`: `vllm_server_host`
            with ports `vllm_server_port`, `vllm_server_port + 1`, ... (agent i's weight-update group uses
            `vllm_group_port + i`).

        > Parameters that control the reward and the credit

        agent_reward_aggregation (`str`, *optional*, defaults to `"mean"`):
            How a reward in TRL's convention (`f(completions, **kwargs)`, a reward model), which scores one agent's
            completions, becomes a joint reward: `"mean"`, `"sum"`, `"min"` or `"max"` over the agents, or an agent's
            index (`"0"`) to score that agent alone.
        discount (`float`, *optional*, defaults to `1.0`):
            Return of a joint answer = its reward + `discount` * mean return of the joint answers that follow it.
        advantage_baseline (`str`, *optional*, defaults to `"mean"`):
            What each completion's return is compared with, within its group (one agent's K completions at one node):
            `"mean"`, the group mean (GRPO); `"rloo"`, the mean of the K - 1 others (RLOO); `"max"`, the group's best
            return; `"none"`, nothing (raw returns, REINFORCE). `scale_rewards` then divides by the std, as in TRL.
        scale_rewards (`str`, *optional*, defaults to `"group"`):
            TRL's field with two more values: `"agent"` divides each agent's group advantages by the std of that
            agent's own returns in the batch (Dr. MAS), where `"batch"` divides by the std of every agent's;
            `"group_zscore"` standardises each group's centred returns (minus their mean, over their population std
            clamped at 1e-6), so that every `advantage_baseline` gives the same advantages.
        team_reward_weight (`float`, *optional*, defaults to `1.0`):
            alpha of PettingLLMs' reward mix: agent i learns from `alpha * team + (1 - alpha) * own_i`, where `own_i`
            counts agent i's own value of each per-agent reward function (TRL's convention), or of an environment's
            `get_reward()` when its class sets `per_agent_reward = True`, in place of their aggregate. `1.0`: every
            agent learns from the team's reward. Below 1 needs such a per-agent reward.

        > Parameters that control the training

        update_chunk_size (`int` or `None`, *optional*):
            Most rows of one agent in one forward and backward of the update (and of the old/reference log-prob
            passes). A micro-batch holds every tree row of its prompts, which grows with K and `num_turns`; it runs in
            chunks of this size, each with its own backward, and the gradients accumulate inside the optimizer step.
            The update is the same (each chunk's loss is weighted as `loss_type` normalises); only memory and speed
            change. A multiple of `num_generations` keeps each prompt's K rows in one chunk, so that `share_prompts`
            runs the prompt once. `None` (default): `per_device_train_batch_size`.
        share_prompts (`bool`, *optional*, defaults to `True`):
            Run each distinct prompt through an agent once, and give its keys and values to the K completions that
            continue it: in the update, in the old/reference log-prob passes and in the prefill of `generate`. The
            result equals the plain computation up to float rounding. It applies to rotary models whose layers all
            use full attention (Llama, Qwen2, Mistral without sliding window, ...); other models, prompt/prefix-tuning
            adapters and reentrant activation checkpointing use the plain computation, and so does `generate` with
            beams, several sequences per row or a `cache_implementation`.
        logprob_temperature (`float` or `None`, *optional*):
            The temperature the update's log-probabilities (the policy's, the old policy's and the reference's) are
            computed at. `None` (default): the sampling `temperature`, as GRPOTrainer computes them. `1.0`: the
            model's own distribution, whatever the sampling temperature (plain REINFORCE). With vLLM's
            importance-sampling correction it must be `None`: the sampler's log-probs are at the sampling temperature.
        check_functions_before_training (`bool`, *optional*, defaults to `False`):
            Opt-in: call the reward and the transition once on the first training row with placeholder answers (and
            reset and fork the environment for them) when the trainer is built, so that a wrong return (count, type,
            NaN) fails before any generation. Off, as GRPOTrainer, the user's functions and environments are called by
            training and evaluation only: their signatures are still checked when the trainer is built, and a wrong
            return fails at its first call, after the first generation and before any update.

        > Parameters that control the agents' tools

        tool_call_timeout (`float` or `None`, *optional*):
            Seconds one tool call may run (a tool of `tools=` or an environment's method). A call past it counts as a
            failed call, and the agent gets `{"error": ...}` saying it timed out; an async tool is cancelled, a sync one
            runs on in its thread, unwaited. `None`: no limit, as in TRL.

        > Parameters that control logging

        log_rollout_trees (`bool`, *optional*, defaults to `False`):
            Write the rollout tree of every logged step (or every `rollout_trees_steps`) to
            `<output_dir>/rollout_trees/step_{step:05d}.json.gz`: per node, every agent's prompt and completions with
            their token counts, tool calls and results, each reward function's value, the joint reward, the return,
            each completion's advantage, and whether it ended early, was pruned by `branching` or was truncated. The
            trees of every process are gathered; the main process writes. With `report_to="wandb"`, each step's tree is
            also logged as the table `rollout_tree`. `python -m trl_multiagent.view <output_dir>` shows them in a
            browser (docs/viewer.md).
        rollout_trees_steps (`int` or `None`, *optional*):
            With `log_rollout_trees`: record every this many optimizer steps. `None`: every step the Trainer logs
            (`logging_steps`).
        rollout_trees_max_chars (`int`, *optional*, defaults to `2000`):
            With `log_rollout_trees`: longest text kept (a prompt, a completion, a tool message); a longer one keeps
            its first and last halves around a marker ``…[N characters cut]…``.

    CoMLRL 1.4.3's names and defaults are `trl_multiagent.comlrl.MAGRPOConfig`'s (docs/from_comlrl.md); given here,
    one is refused with the TRL name it means.

    `use_vllm=True` generates with vLLM: `vllm_mode="colocate"` runs one engine per agent in each training process
    (one engine with every adapter for a shared-base LoRA team), `"server"` one server per agent. The engines run in
    the policy's dtype; `vllm_gpu_memory_utilization` is split evenly among a process's engines.

    On a machine without a GPU, `bf16` defaults to `False` (TRL's `True` would raise there), `use_cpu` to `True`, and
    `activation_checkpointing` (`gradient_checkpointing` in older transformers, such as 5.19) to `False` (TRL's `True` costs
    40-60% of the update's time on a CPU, where the chunked update already bounds activation memory).

    Example:

    ```python
    >>> from trl_multiagent import MAGRPOConfig
    >>> config = MAGRPOConfig(num_turns=2, num_generations=4, max_new_tokens=64, early_termination_threshold=0.9)
    >>> config.max_completion_length
    64

    ```
    """

    num_turns: int = field(default=1, metadata={"help": "Number of turns; 2 adds a second turn after feedback."})
    discount: float = field(
        default=1.0, metadata={"help": "Return = reward + discount * mean return of the next turn's joint answers."}
    )
    early_termination_threshold: float | None = field(
        default=None,
        metadata={
            "help": "A node whose mean joint reward is above this value is not expanded to the next turn. "
            "None disables early termination."
        },
    )
    joint_mode: str = field(
        default="aligned",
        metadata={
            "help": "How agents' completions form joint answers: 'aligned' (the j-th of each agent, K joint answers "
            "per node) or 'cross' (every combination, K**N).",
            "choices": list(credit_options.JOINT_MODES),
        },
    )
    max_new_tokens: int | None = field(
        default=None, metadata={"help": "Alias of `max_completion_length`; wins when both are given."}
    )
    advantage_baseline: str = field(
        default="mean",
        metadata={
            "help": "What each completion's return is compared with, within its group of K: 'mean' (GRPO), 'rloo' "
            "(the mean of the K-1 others), 'max' (the group's best), 'none' (raw returns). `scale_rewards` then "
            "divides by the std as in TRL.",
            "choices": list(credit_options.BASELINES),
        },
    )
    trainable_agents: list[int] | None = field(
        default=None,
        metadata={
            "help": "Indices of the agents that train; the others act in rollouts with frozen weights (e.g. a "
            "fixed partner). None trains every agent."
        },
    )
    eval_do_sample: bool = field(
        default=True,
        metadata={
            "help": "Sample evaluation rollouts like training ones (True) or decode greedily (False). Set "
            "`eval_on_start=True` for a baseline evaluation before training."
        },
    )
    check_functions_before_training: bool = field(
        default=False,
        metadata={
            "help": "Opt-in: call the reward and transition once with placeholder answers (and reset the environment "
            "for them) when the trainer is built, so that a wrong return fails before any generation. Off, they are "
            "called by training and evaluation only; a wrong return then fails at its first call, before any update."
        },
    )
    share_prompts: bool = field(
        default=True,
        metadata={
            "help": "Run each distinct prompt through an agent once and share its keys and values with the "
            "completions that continue it (update, log-prob passes, generation prefill). Same result, less compute."
        },
    )

    max_prompt_length: int | None = field(
        default=None,
        metadata={
            "help": "Longest prompt (tokens) an agent is given. A longer text prompt keeps its last tokens (the newest "
            "feedback); a longer chat prompt drops its oldest messages after the first user turn. None: the agent's "
            "max_position_embeddings (or vllm_max_model_length) minus max_completion_length. The count is logged as "
            "`prompts/truncated`."
        },
    )
    gradient_checkpointing: bool | None = field(
        default=None,
        metadata={
            "help": "Activation checkpointing (alias of `activation_checkpointing`). None: True with a GPU (TRL's "
            "default), False on a CPU, where it costs 40-60%% of the update's time and the chunked update "
            "(update_chunk_size) already bounds activation memory.",
            "nargs": "?",
            "const": True,
        },
    )
    update_chunk_size: int | None = field(
        default=None,
        metadata={
            "help": "Most rows of one agent in one forward/backward of the update; gradients accumulate over the "
            "chunks. Same update, bounded memory. None: per_device_train_batch_size."
        },
    )
    logprob_temperature: float | None = field(
        default=None,
        metadata={
            "help": "Temperature of the update's log-probs (policy, old policy, reference). None: the sampling "
            "`temperature`, as in TRL; 1.0: the model's own distribution (plain REINFORCE)."
        },
    )
    generate_chunk_size: int | None = field(
        default=None,
        metadata={
            "help": "Most rows (prompts x K) of one agent in one generate call; a node's K rows stay together. None: "
            "one call per agent per turn. Colocated vLLM: the engines' max_num_seqs; server mode: the server's own."
        },
    )
    num_agents: int | None = field(
        default=None,
        metadata={"help": "Team size for a model copied per agent (`MAGRPOTrainer(model=...)`). None: as given."},
    )
    agent_reward_aggregation: str = field(
        default="mean",
        metadata={
            "help": "How a per-agent reward (TRL's convention: f(completions, **kwargs), or a reward model) becomes "
            f"the joint reward: one of {list(AGENT_REWARD_AGGREGATIONS)} over the agents, or an agent's index."
        },
    )
    scale_rewards: str = field(
        default="group",
        metadata={
            "help": "How advantages are scaled, TRL's three and two more: 'group' (True; each group's std), 'batch' "
            "(the std of every return in the batch, every agent's), 'agent' (the std of that agent's own returns, as "
            "Dr. MAS), 'group_zscore' (each group's centred returns minus their mean, over their population std), "
            "'none' (False; no scaling).",
            "choices": list(credit_options.SCALINGS),
        },
    )
    branching: str = field(
        default="all",
        metadata={
            "help": "Which joint answers of a node continue to the next turn: 'all', 'best' (highest joint reward, "
            "AT-GRPO) or 'top' (the `branching_top_m` best).",
            "choices": list(credit_options.BRANCHINGS),
        },
    )
    branching_top_m: int | None = field(
        default=None, metadata={"help": "With branching='top': how many joint answers of each node continue."}
    )
    team_reward_weight: float = field(
        default=1.0,
        metadata={
            "help": "alpha: agent i learns from alpha * team reward + (1 - alpha) * its own reward (per-agent reward "
            "functions, or an environment with per_agent_reward = True). 1.0: the team's reward only."
        },
    )
    agent_learning_rates: list[float] | None = field(
        default=None,
        metadata={"help": "One learning rate per agent (optimizer parameter groups). None: `learning_rate` for all."},
    )
    vllm_server_base_urls: list[str] | None = field(
        default=None,
        metadata={
            "help": "vllm_mode='server': one vLLM server URL per agent. None: vllm_server_host with ports "
            "vllm_server_port + i."
        },
    )

    # Agents that act (`tools=`, `environment_factory=`), beside TRL's `max_tool_calling_iterations`
    tool_call_timeout: float | None = field(
        default=None,
        metadata={
            "help": "Seconds one tool call may run; past it the call fails and the agent gets the error. None: no "
            "limit, as in TRL."
        },
    )

    # The rollout trees, recorded for `python -m trl_multiagent.view` and the trackers (`trees`)
    log_rollout_trees: bool = field(
        default=False,
        metadata={
            "help": "Write the rollout tree of every logged step (or every `rollout_trees_steps`) to "
            "<output_dir>/rollout_trees/step_{step:05d}.json.gz (texts, token counts, tools, rewards, returns, "
            "advantages; every process's trees, written by the main one), and with report_to wandb log it as a table. "
            "View it with `python -m trl_multiagent.view <output_dir>`."
        },
    )
    rollout_trees_steps: int | None = field(
        default=None,
        metadata={"help": "With log_rollout_trees: record every this many steps. None: every logged step."},
    )
    rollout_trees_max_chars: int = field(
        default=2000,
        metadata={
            "help": "With log_rollout_trees: longest text kept; a longer one keeps its first and last halves around "
            "a marker '…[N characters cut]…'."
        },
    )

    def __post_init__(self):
        if not has_accelerator():
            # TRL defaults bf16 to True, which raises on a CPU-only machine (and this CPU has no fast bf16 anyway).
            if self.bf16 is None:
                self.bf16 = False
                logger.info_once("MAGRPOConfig: no GPU, so bf16=False (TRL's default, True, would raise on a CPU).")
            uses_deepspeed = self.deepspeed is not None or os.environ.get("ACCELERATE_USE_DEEPSPEED") == "true"
            if not uses_deepspeed and not self.use_cpu:
                # Without use_cpu, two CPU processes launched with torchrun silently train two independent copies.
                self.use_cpu = True
                logger.info_once(
                    "MAGRPOConfig: no GPU, so use_cpu=True (without it, CPU processes launched together would train "
                    "independent copies)."
                )
            elif int(os.environ.get("WORLD_SIZE", "1")) > 1:
                self._check_deepspeed_on_cpu()
        # Every agent runs a forward on every micro-step (inert rows fill in), so DDP need not search for unused
        # parameters; transformers would otherwise turn the search on for a model that is not a PreTrainedModel.
        if self.ddp_find_unused_parameters is None:
            self.ddp_find_unused_parameters = False
            logger.info_once(
                "MAGRPOConfig: ddp_find_unused_parameters=False (every agent runs a forward on every micro-step)."
            )
        if self.gradient_checkpointing is None and getattr(self, "activation_checkpointing", None) is None:
            name = ACTIVATION_CHECKPOINTING
            setattr(self, name, has_accelerator())
            if not has_accelerator():
                logger.info_once(
                    f"MAGRPOConfig: no GPU, so {name}=False (TRL's default, True, costs 40-60% of the update's time on "
                    "a CPU; the update runs in chunks of update_chunk_size rows either way)."
                )
        if self.max_new_tokens is not None:
            self.max_completion_length = self.max_new_tokens
        # Before GRPOConfig, whose own checks of these divide by num_generations and do not say what to change
        self._check_num_generations()
        self._check_whole_prompts()
        self._grpo_post_init()
        self.max_new_tokens = self._applied_max_new_tokens = self.max_completion_length
        self._check_fields()

    def _grpo_post_init(self) -> None:
        """GRPOConfig's `__post_init__`, as one method: the CoMLRL face's actor-critic configs override it to accept the
        one generation per prompt that GRPOConfig refuses, their critic being the baseline (docs/critics.md)."""
        super().__post_init__()

    def check(self) -> None:
        """Every rule `__post_init__` applies after GRPOConfig's, again (their code is `_check_num_generations` and
        `_check_fields`, written once): a dataclass field can be set after the config was built, and no setter checks
        it, so the trainer calls this when it is built, and a field set late is refused as one given to the
        constructor."""
        self._check_num_generations()
        self._check_fields()

    def _check_fields(self) -> None:
        """Refuse what `MAGRPOTrainer` cannot do, naming the field; after GRPOConfig's `__post_init__`, which counted
        the processes that share the generation batch."""
        applied = getattr(self, "_applied_max_new_tokens", self.max_new_tokens)  # the alias, applied when built
        if self.max_new_tokens not in (applied, self.max_completion_length):  # set later: TRL's name is what is read
            raise ValueError(
                f"MAGRPOConfig: max_new_tokens={self.max_new_tokens} was set after the config was built, and is an "
                f"alias applied when it is built (max_completion_length={self.max_completion_length} is what trains). "
                "Set max_completion_length, or pass max_new_tokens to MAGRPOConfig(...)."
            )
        self._check_whole_prompts(num_processes=self.world_size)
        if self.num_turns < 1:
            raise ValueError(f"MAGRPOConfig: num_turns must be >= 1, got {self.num_turns}.")
        if self.num_agents is not None and self.num_agents < 1:
            raise ValueError(f"MAGRPOConfig: num_agents must be >= 1 or None, got {self.num_agents}.")
        if self.num_train_epochs <= 0 and self.max_steps <= 0:
            raise ValueError(
                f"MAGRPOConfig: num_train_epochs must be > 0 (or max_steps > 0), got {self.num_train_epochs}: no step "
                "would run."
            )
        if self.per_device_eval_batch_size < 1:
            raise ValueError(
                f"MAGRPOConfig: per_device_eval_batch_size must be >= 1, got {self.per_device_eval_batch_size}."
            )
        credit_options.check("advantage_baseline", self.advantage_baseline)
        credit_options.check("joint_mode", self.joint_mode)
        check_agent_reward_aggregation(self.agent_reward_aggregation, self.num_agents)
        if self.use_vllm:
            check_vllm_config(self)
        if self.max_prompt_length is not None and self.max_prompt_length < 1:
            raise ValueError(f"MAGRPOConfig: max_prompt_length must be >= 1 or None, got {self.max_prompt_length}.")
        check_loss_type(self.loss_type)
        if str(getattr(self.optim, "value", self.optim)) in ("lomo", "adalomo"):
            raise ValueError(
                f"MAGRPOConfig: optim={getattr(self.optim, 'value', self.optim)!r} is not supported: LOMO fuses the "
                "optimizer step into each backward, and the update runs one backward per chunk (update_chunk_size). "
                "Use another optimizer."
            )
        world, local = (int(os.environ.get(name, "1")) for name in ("WORLD_SIZE", "LOCAL_WORLD_SIZE"))
        deepspeed = self.deepspeed is not None or os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true"
        if self.save_on_each_node and deepspeed and world > local:
            # (tests/test_distributed.py: with a folder per node, node 1 cannot resume)
            raise ValueError(
                "MAGRPOConfig: save_on_each_node=True with DeepSpeed on several nodes is not supported: DeepSpeed "
                "writes its checkpoint's `latest` tag on the first node only, so another node cannot resume from its "
                "own folder. Put output_dir on a filesystem all nodes share (save_on_each_node=False), or train with "
                "DDP, where each node's folder resumes exactly."
            )
        if self.rollout_trees_steps is not None and self.rollout_trees_steps < 1:
            raise ValueError(
                f"MAGRPOConfig: rollout_trees_steps must be >= 1 or None, got {self.rollout_trees_steps}."
            )
        if self.rollout_trees_max_chars < 16:
            raise ValueError(
                f"MAGRPOConfig: rollout_trees_max_chars must be >= 16, got {self.rollout_trees_max_chars}: a text keeps "
                "its first and last halves around the cut marker."
            )
        self._check_logprob_temperature()
        for name in ("update_chunk_size", "generate_chunk_size"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"MAGRPOConfig: {name} must be >= 1 or None, got {getattr(self, name)}.")
        # NaN passes `x < 0` (it fails every comparison); inf makes the returns or the loss inf or NaN
        for name in ("discount", "beta"):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) >= 0):
                raise ValueError(f"MAGRPOConfig: {name} must be a finite number >= 0, got {getattr(self, name)}.")
        if self.early_termination_threshold is not None and math.isnan(self.early_termination_threshold):
            raise ValueError(
                "MAGRPOConfig: early_termination_threshold must be a number (inf: never end early) or None (no early "
                "termination), got nan."
            )
        if not self.temperature > 0:
            raise ValueError(
                f"MAGRPOConfig: temperature must be > 0, got {self.temperature}. The num_generations completions of a "
                "prompt are sampled and compared with each other: greedy decoding would make them identical and every "
                "advantage zero. For greedy evaluation rollouts, set eval_do_sample=False."
            )
        self._check_credit_options()
        credit_options.check("scale_rewards", self.scale_rewards)
        if self.sync_ref_model and self.beta == 0.0:
            raise ValueError(
                "MAGRPOConfig: You passed `sync_ref_model=True` while `beta=0.0`, which means the reference model is "
                "not used during training. Consequently, there is nothing to synchronize. Please set "
                "`sync_ref_model=False`, or set `beta` to a non-zero value."
            )
        if self.multi_objective_aggregation not in MULTI_OBJECTIVE_AGGREGATIONS:
            raise ValueError(
                f"MAGRPOConfig: multi_objective_aggregation must be one of {MULTI_OBJECTIVE_AGGREGATIONS}, got "
                f"{self.multi_objective_aggregation!r}."
            )
        if self.advantage_scale != self.scale_rewards and self.scale_rewards not in ("group", "batch"):
            logger.warning_once(
                f"MAGRPOConfig: multi_objective_aggregation='normalize_then_sum' scales the advantages by the batch's "
                f"std, as TRL does; scale_rewards={self.scale_rewards!r} is not used."
            )

    def _check_logprob_temperature(self) -> None:
        value = self.logprob_temperature
        if value is None:
            return
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
            raise ValueError(f"MAGRPOConfig: logprob_temperature must be a finite number > 0 or None, got {value!r}.")
        if self.use_vllm and self.vllm_importance_sampling_correction and value != self.temperature:
            raise ValueError(
                f"MAGRPOConfig: logprob_temperature={value} with use_vllm=True and "
                "vllm_importance_sampling_correction=True: the correction compares vLLM's log-probs, taken at the "
                f"sampling temperature ({self.temperature}), with the update's, so both must be at one temperature. "
                "Leave logprob_temperature None, or set vllm_importance_sampling_correction=False."
            )

    @property
    def update_temperature(self) -> float:
        """The temperature of the update's log-probs: `logprob_temperature`, or the sampling `temperature`."""
        return self.temperature if self.logprob_temperature is None else float(self.logprob_temperature)

    @property
    def advantage_scale(self) -> str:
        """The `scale_rewards` the advantages use: `"batch"` with `multi_objective_aggregation="normalize_then_sum"`,
        whose rewards are already normalised per node and function (TRL's rule), else `scale_rewards`."""
        return "batch" if self.multi_objective_aggregation == "normalize_then_sum" else self.scale_rewards

    def max_turn_sequences(self, num_agents: int) -> int:
        """Completions of the largest turn one process generates for one agent: K per live node.

        >>> config = MAGRPOConfig("out", num_generations=2, per_device_train_batch_size=2, per_device_eval_batch_size=2)
        >>> config.num_turns = 2  # one prompt, K = 2: 2 completions at turn 1, 2 nodes x 2 at turn 2
        >>> config.max_turn_sequences(num_agents=2)
        4
        """
        k = max(self.num_generations, self.num_generations_eval or 0)
        prompts = max(  # a generation batch holds each prompt K times
            self.per_device_train_batch_size * self.steps_per_generation // self.num_generations,
            self.per_device_eval_batch_size // (self.num_generations_eval or self.num_generations),
        )
        choices = len(joint_choices(num_agents, k, self.joint_mode))
        children = expanded_per_node(choices, self.branching, self.branching_top_m)  # of a node that goes on
        return k * prompts * children ** (self.num_turns - 1)

    def _check_credit_options(self) -> None:
        credit_options.check_branching(self.branching, self.branching_top_m)
        if not (math.isfinite(self.team_reward_weight) and 0.0 <= self.team_reward_weight <= 1.0):
            raise ValueError(f"MAGRPOConfig: team_reward_weight must be in [0, 1], got {self.team_reward_weight}.")
        check_rates(self.agent_learning_rates, self.num_agents, f"num_agents={self.num_agents}")

    def _check_num_generations(self) -> None:
        if self.num_generations is None or self.num_generations < 2:
            raise ValueError(
                f"MAGRPOConfig: num_generations must be >= 2, got {self.num_generations}: each agent's "
                "num_generations completions at a node form the group its advantages compare."
            )

    def _check_whole_prompts(self, num_processes: int | None = None) -> None:
        """A process's generation batch must hold whole groups of K: trees grow from whole prompts on one process.

        Runs before GRPOConfig's check of the global batch, and again with `num_processes` once TrainingArguments
        knows it: a `generation_batch_size` is split among the processes.
        """
        k, rows = self.num_generations, self.per_device_train_batch_size
        if self.generation_batch_size is None:  # GRPOConfig derives it from these
            if self.steps_per_generation is None:  # GRPOConfig takes gradient_accumulation_steps for it
                steps, named = self.gradient_accumulation_steps, "gradient_accumulation_steps"
            else:
                steps, named = self.steps_per_generation, "steps_per_generation"
            if rows * steps % k != 0:
                raise ValueError(
                    f"MAGRPOConfig: per_device_train_batch_size * {named} ({rows} * {steps} = {rows * steps}) must be "
                    f"a multiple of num_generations ({k}), so that each process holds whole prompts. For example, set "
                    f"per_device_train_batch_size={k}."
                )
        elif num_processes is not None or self.steps_per_generation is None:  # with both set, GRPOConfig refuses
            batch = self.generation_batch_size
            if batch % (k * (num_processes or 1)) != 0:
                processes = "" if num_processes is None else f" ({num_processes})"
                step = math.lcm(k, rows) * (num_processes or 1)  # GRPOConfig wants a multiple of the global rows too
                raise ValueError(
                    f"MAGRPOConfig: generation_batch_size ({batch}) must be a multiple of num_generations ({k}) times "
                    f"the number of processes{processes}, so that each process holds whole prompts. For example, set "
                    f"generation_batch_size={-(-batch // step) * step}."
                )

    def _check_deepspeed_on_cpu(self):
        """DeepSpeed in several CPU processes needs a gloo process group, which transformers and accelerate do not make
        on their own there: with no accelerator accelerate leaves the backend unset and counts 1 process while DeepSpeed
        counts all of them (its batch-size check fails with a message about GPUs). Under `accelerate launch` with a
        DeepSpeed config, `ddp_backend` names it (a field, like `use_cpu`). With `deepspeed=` in the config,
        TrainingArguments ignores `ddp_backend`: the launch must make the state first, and the config must say it uses
        it; nothing here builds it, as GRPOConfig does not."""
        if self.deepspeed is None:
            self.ddp_backend = self.ddp_backend or "gloo"
            return
        given = self.accelerator_config or {}  # a dict, an AcceleratorConfig, or a JSON file's path (not read here)
        if not (
            given.get("use_configured_state")
            if isinstance(given, dict)
            else getattr(given, "use_configured_state", True)
        ):
            raise ValueError(
                f"MAGRPOConfig: deepspeed={self.deepspeed!r} in {os.environ['WORLD_SIZE']} processes without a GPU "
                "needs a gloo process group made before the config, which transformers does not make on a CPU. "
                "Launch with `accelerate launch --config_file accelerate_configs/zero2.yaml` (or zero3.yaml) and no "
                "`deepspeed=`, or build `accelerate.PartialState(backend='gloo')` while ACCELERATE_USE_DEEPSPEED=true "
                "is set and pass accelerator_config={'use_configured_state': True}."
            )
