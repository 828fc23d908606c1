"""`MAGRPOTrainer`: GRPOTrainer for a team of N agents trained on a joint reward, over one or more turns."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from types import MappingProxyType
from typing import Any, NamedTuple

import torch
from accelerate.utils import gather_object
from datasets import Dataset, IterableDataset
from transformers import PreTrainedTokenizerBase
from trl import GRPOTrainer
from trl.models.utils import disable_gradient_checkpointing

from . import arguments, credit
from .checkpoint import TeamCheckpointing, resume_folder
from .config import MAGRPOConfig
from .distributed import deferred_gradient_reduction, max_over_processes, sync_turn
from .environment_lifecycle import close_environments, keep_every_column
from .environments.worlds import closes_worlds_on_error
from .generation import build_generator
from .generation.output import Generation
from .keywords import unexpected_trainer_keyword
from .metrics import completion_log_rows, completion_logs, rollout_metrics, rollout_stats
from .rollout import RolloutTree, run_rollout
from .rollout.task import TaskRecord
from .team.assembly import build_reference, build_team, fused_heads_on_agents
from .team.optimizer import agent_rates_optimizer
from .timing import MicroStep, Reading, RolloutTimes, UpdateTimes
from .trees import TreeRecorder
from .update.batching import add_row_columns, loss_mask, pad_rows, row_tokens, split_micro_batches, tree_rows
from .update.chunking import update_chunks
from .update.entropy import TeamEntropyBonus
from .update.importance import RatioFromLoss, add_importance_sampling_ratio, reduce_sampling_stats, sampling_stats
from .update.loss_call import LossCall
from .update.prefix import chunked_per_token_logps, prompt_sharing, uses_reentrant_checkpointing


@dataclass
class Rollout:
    """One rollout of `MAGRPOTrainer._rollout`, made for it and handed on: its tree, and what the step's metrics read of
    it (the task's `record`, the phases' `times`, the prompts cut to `max_prompt_length`)."""

    record: TaskRecord
    times: RolloutTimes = field(default_factory=RolloutTimes)  # with the `logps` passes after it
    truncated_prompts: int = 0
    tree: RolloutTree | None = None  # once grown


class StepCredit(NamedTuple):
    """What `MAGRPOTrainer._advantages` gives a step: `credit.assign`'s returns and credited rewards (logged), the
    advantages ``(nodes, agents, K)`` the loss takes, and per-completion `columns`, tables of the same shape that each
    agent's rows carry into `compute_loss` under their names (`update.batching.add_row_columns`; an inert row repeats
    the first row's: `pad_rows`). A subclass adds to its parent's columns."""

    returns: Any
    credited: Any
    advantages: torch.Tensor
    columns: Mapping[str, torch.Tensor] = MappingProxyType({})


class MAGRPOTrainer(TeamCheckpointing, TeamEntropyBonus, GRPOTrainer):
    """
    Trainer for MAGRPO: N cooperating agents, one joint reward, multi-turn tree rollouts with feedback between turns.

    What changes from [`~trl.GRPOTrainer`]:

    - the model is an [`AgentTeam`] of N policies, so one optimizer and one accelerate/DeepSpeed engine hold them all
      (one agent: its own model, as GRPOTrainer's; `AgentTeam.trainer_model`);
    - `_generate_and_score_completions` is the step read top to bottom: a rollout grows a tree per prompt
      (`rollout.run_rollout`: each turn, one batched generation per agent over every live node, with transformers
      `generate` or vLLM, one call of the joint reward, the transition for each branch that goes on; the public
      `rollout` is the same, for `evaluation`); `_advantages` gives returns and group-relative advantages
      (`credit.assign`; a subclass with another estimate overrides it: the CoMLRL face's IAC and MAAC, a learned
      critic's TD advantages);
      `update.batching` turns each agent's completions into rows;
    - `_prepare_inputs` cuts each agent's rows into micro-batches that hold every agent;
    - `compute_loss` runs TRL's own `_compute_loss` once per agent and sums the results, in chunks of at most
      `update_chunk_size` rows per agent, each with its own backward (`chunking`), less each agent's entropy bonus
      (`update.entropy.TeamEntropyBonus`, which also overrides `_save_optimizer_and_scheduler` and
      `_load_optimizer_and_scheduler` to keep its coefficients in the checkpoints, as GRPOTrainer does);
    - `_get_per_token_logps_and_entropies` runs rows sorted by length, and each distinct prompt once for the K rows
      that continue it (`share_prompts`, as does the prefill of `generate`); inside one call of `_compute_loss` it
      hands the policy's forward to that call (`update.loss_call`: the vLLM ratio of on-policy rows, the entropies);
    - `training_step` is GRPOTrainer's, with the update timed apart from the rollout (`timing`);
    - `create_optimizer` gives each agent its own groups at its rate with `agent_learning_rates`
      (`team.optimizer.agent_rates_optimizer`);
    - `train` resumes from the newest *complete* checkpoint with `resume_from_checkpoint=True`, and closes the
      environments' instances when it ends (`environment_lifecycle`);
    - saving and resuming (`checkpoint.TeamCheckpointing`): `_save` writes `agent_{i}/` folders, and a team of one
      into the folder itself as GRPOTrainer (the class attribute `one_agent_in_agent_folder = True` keeps `agent_0/`,
      CoMLRL's layout); `_load_from_checkpoint` reads either layout back; `_save_checkpoint` marks it complete once
      every process wrote it; `_get_train_sampler` seeds each epoch's prompt order by the epoch, so that a resumed run
      sees the same order; `create_model_card` writes the team's card (`model_card.team_card`: the agents and their
      folders, bases, adapters, rewards, turns, and how to load them, `trl_multiagent.load_team` for the team) where
      TRL writes its card and in every folder `_save` writes the team into; PEFT's and transformers' files are left as
      they wrote them;
    - `evaluate` and `_remove_unused_columns` (`environment_lifecycle`): the environments' instances made by an
      `evaluate` on its own are closed after it, and every dataset column is kept for them;

    The methods not listed here are helpers of this class, not overrides. What one call hands the next is passed or
    returned (a rollout's measures: `Rollout`), but for `last_rollout`, the latest tree, kept for callbacks (the
    demo's sample answers); where TRL's own code calls ours and returns nothing we need, the hand-off is open only for
    that call: `training_step` around `_prepare_inputs` (`_micro_step`), `_compute_loss` around
    `_get_per_token_logps_and_entropies` (`_open_loss_call`). TRL's loss types, clipping, KL, logging,
    optimizer (but for `agent_learning_rates`) and accelerate preparation are used unchanged.

    Args (GRPOTrainer's, in its order, then the team's own):
        model: one model or id (one agent, as GRPOTrainer; with `num_agents=N`, N copies, and with `peft_config` one
            base with an adapter per agent), or a list with one per agent (heterogeneous allowed).
        reward_funcs: joint rewards (a list of completions per agent) or TRL's (each agent scored, combined by
            `args.agent_reward_aggregation`): read from the signature, or stated (`joint`, `per_agent`, ...).
        processing_class: one tokenizer for every agent, or one per agent.
        reward_processing_classes, quantization_config, peft_config (one, or one per agent), callbacks, optimizers,
        rollout_func (refused, with the reason): GRPOTrainer's.
        tools, environment_factory: GRPOTrainer's, for a team (`rollout.tools`, `environments.worlds`): tools for every
            agent or per agent; one world per joint action, shared by its agents: pooled in turn 1, forked per branch
            after it (`environments.forks`).
        num_agents: the team's size for one model copied per agent (or `args.num_agents`).
        external_transition: builds each agent's next prompt from a branch (needed when `num_turns > 1`).
        formatters: per-agent callables mapping a dataset row to that agent's first prompt (one serves every agent).

    CoMLRL 1.4.3's names and defaults: `trl_multiagent.comlrl.MAGRPOTrainer`, a subclass of this one.

    Example:

    ```python
    from datasets import Dataset
    from trl_multiagent import MAGRPOConfig, MAGRPOTrainer

    dataset = Dataset.from_dict({"prompt": ["Describe a city in the clouds:", "Invent a new holiday and explain it:"]})
    def ratio_reward(completions1, completions2):  # one list per agent, one value per joint answer
        return [min(len(b) / max(len(a), 1), 3.0) for a, b in zip(completions1, completions2)]

    trainer = MAGRPOTrainer(
        model="HuggingFaceTB/SmolLM2-135M-Instruct",  # a hub id, a saved folder or a model in memory
        num_agents=2,  # two copies of it, trained apart; or model=[model_a, model_b]
        reward_funcs=ratio_reward, train_dataset=dataset,
        args=MAGRPOConfig(num_generations=4, per_device_train_batch_size=8, max_completion_length=64),
    )
    trainer.train()
    ```
    """

    # Open only within one call of TRL's code that calls ours: `training_step` (`_prepare_inputs` hands it the
    # rollout's share of the step) and `_compute_loss` (the log-prob function hands it the policy's forward).
    _micro_step: MicroStep | None = None
    _open_loss_call: LossCall | None = None

    @closes_worlds_on_error  # the environments' instances made so far close if building the trainer fails
    def __init__(
        self,
        model: str | torch.nn.Module | Sequence[str | torch.nn.Module],
        reward_funcs: Callable | Sequence[Callable] | None = None,
        args: MAGRPOConfig | None = None,
        train_dataset: Dataset | IterableDataset | None = None,
        eval_dataset=None,
        processing_class: PreTrainedTokenizerBase | Sequence[PreTrainedTokenizerBase] | None = None,
        reward_processing_classes=None,
        callbacks=None,
        optimizers=(None, None),
        quantization_config=None,
        peft_config=None,
        tools=None,
        rollout_func=None,
        environment_factory=None,
        *,
        num_agents: int | None = None,
        external_transition: Callable | None = None,
        formatters: Sequence[Callable[[dict], Any]] | None = None,
        **unexpected,
    ):
        if unexpected:  # named with the closest arguments, or, for another face's, with TRL's name and that face
            raise TypeError(unexpected_trainer_keyword(type(self), next(iter(unexpected))))
        # Everything that can be checked without loading a model is checked first (`arguments.prepare`); the small
        # tokenizers load before the models, as the first prompts need them (chat messages need a chat template).
        inputs = self._prepare_arguments(
            args, model=model, num_agents=num_agents, processing_class=processing_class, reward_funcs=reward_funcs,
            external_transition=external_transition, formatters=formatters, train_dataset=train_dataset,
            eval_dataset=eval_dataset, peft_config=peft_config, quantization_config=quantization_config, tools=tools,
            rollout_func=rollout_func, environment_factory=environment_factory, optimizers=optimizers,
        )  # fmt: skip
        args, plan = inputs.args, inputs.plan
        self.num_agents, self.trainable_agents = plan.num_agents, plan.trainable
        self.tokenizers, self.task = inputs.tokenizers, inputs.task
        self.credit_rules = inputs.credit_rules  # the credit options, looked up once (`credit.options.rules_of`)
        self.tool_calling, self.last_rollout = inputs.tool_calling, None

        built = build_team(plan, self.tokenizers, inputs.agent_init_kwargs, inputs.grows_embeddings, args.beta != 0.0)
        self.team, self.agent_eos_token_ids = built
        reward_funcs = arguments.load_reward_models(self.task.joint_reward.funcs, args)
        with arguments.grpo_trainer_settings(args, self.task.joint_reward.weights):
            super().__init__(
                model=self.team.trainer_model,  # a team of one: the agent's own model, as GRPOTrainer's
                reward_funcs=reward_funcs,
                args=args,
                train_dataset=inputs.train_dataset,
                eval_dataset=inputs.eval_dataset,
                processing_class=self.tokenizers[0],
                reward_processing_classes=reward_processing_classes,
                callbacks=callbacks,
                optimizers=optimizers,
            )
        self.beta, self.use_vllm = args.beta, args.use_vllm
        self._set_up_entropy_bonus(args)  # GRPOTrainer's entropy bonus, per agent (`update.entropy`)
        self.task.joint_reward.bind_models(self.reward_funcs, self.reward_processing_classes)
        for callback in inputs.callbacks:  # the learning-signal warnings (`arguments`)
            self.add_callback(callback)
        # the log-prob heads at `logprob_temperature` (GRPOTrainer's: the sampling temperature, `self.temperature`)
        fused_heads_on_agents(self.team, args.update_temperature, args.cast_lm_head_to_fp32)
        self.share_prompts = prompt_sharing(self.team, args.share_prompts)
        self.ref_team, reference_sync = build_reference(self.accelerator, self.team, args, args.update_temperature)
        # GRPOTrainer's `ref_model` (None for adapters, as GRPOTrainer's with PEFT): a team of one's is the agent's copy
        self.ref_model = None if self.ref_team is None else self.accelerator.unwrap_model(self.ref_team).trainer_model
        self.tools = self.tool_calling.all_tools() if self.tool_calling else []  # GRPOTrainer's: every agent's
        if self.task.worlds is not None:  # GRPOTrainer's, which TRL's tests read (docs/agents.md, "Environments")
            self._env_tools, self._environment_pool = (
                self.tool_calling.environment_tools(),
                self.task.worlds.pool.instances,
            )
        if reference_sync is not None:  # sync_ref_model: each agent's reference (a copy, or an adapter) follows it
            self.add_callback(reference_sync)
        self.update_chunk_size = args.update_chunk_size or args.per_device_train_batch_size
        self.generator = build_generator(
            args,
            self.team,
            self.tokenizers,
            self.agent_eos_token_ids,
            self.accelerator,
            trainable=self.trainable_agents,
            chat_template_kwargs=self.chat_template_kwargs,
            generation_kwargs=self.generation_kwargs,
            share_prompts=self.share_prompts,
            wrapped_model=lambda: self.model_wrapped,
            chat_templates=self.tool_calling.chat_templates if self.tool_calling else None,
        )
        self._update_times = UpdateTimes()  # over an optimizer step's micro-steps
        self._ratio_from_loss = RatioFromLoss(args)  # over a generation's micro-steps
        self._trees = TreeRecorder(args, self.accelerator, self.max_completion_length)  # log_rollout_trees

    def _prepare_arguments(self, args, **given) -> arguments.PreparedInputs:
        """The arguments checked and resolved before any model loads (`arguments.prepare`). The CoMLRL face overrides
        it to add what its own arguments bring (formatted later turns, added tokens)."""
        return arguments.prepare(args, **given)

    def _generate_for_agent(self, agent: int, prompts: list, num_generations: int, environments=None) -> Generation:
        """Sample `num_generations` completions for every prompt with one batched call of the generation backend; with
        tools, then TRL's tool loop, each completion calling the tools of the world it acts on (`environments`)."""
        greedy, calling = not self.model.training and not self.args.eval_do_sample, self.tool_calling
        tools = calling.prompt_tools(agent, len(prompts), environments, num_generations) if calling else None
        generation = self.generator.generate(agent, prompts, num_generations, greedy, tools)
        if calling is not None:
            # tool rounds go on while any process has calls; a lost world on one process stops all (`sync_turn`)
            any_left = partial(sync_turn, self.accelerator)
            generation = calling.run(agent, generation, environments, self.generator, greedy, any_left)
        return generation

    def _measured_generation(self, rollout: Rollout, agent: int, prompts: list, environments, samples: int):
        """`run_rollout`'s `generate`: `_generate_for_agent`, timed and counted in `rollout`."""
        with rollout.times.phase("generate"):
            generation = self._generate_for_agent(agent, prompts, samples, environments)
        rollout.times.generated_tokens += sum(len(c) for c in generation.completion_ids)
        rollout.truncated_prompts += generation.truncated_prompts
        return generation

    def rollout(self, rows: list[dict], num_generations: int, every_turn: bool = False) -> RolloutTree:
        """One rollout tree over dataset `rows` (a root node each) with the current policies, `num_generations` (K)
        completions per agent and node: the step's first stage (`rollout.run_rollout`), public for `evaluation`. Kept
        as `last_rollout`, with GRPOTrainer's `environments` (each rollout's world). `every_turn`: every turn runs,
        whatever `early_termination_threshold` says (CoMLRL's evaluation)."""
        return self._rollout(rows, num_generations, every_turn).tree

    def _rollout(self, rows: list[dict], num_generations: int, every_turn: bool = False) -> Rollout:
        """`rollout`, returning what it measured with its tree."""
        rollout = Rollout(self.task.record(self.args.num_turns, self.state))
        with rollout.times.phase("sync"):
            self.generator.sync_weights(self.state.global_step)  # only after the weights changed
        rollout.tree = run_rollout(
            rows,
            num_agents=self.num_agents,
            num_generations=num_generations,
            num_turns=self.args.num_turns,
            joint_mode=self.credit_rules.joint_mode,
            termination_threshold=None if every_turn else self.args.early_termination_threshold,
            agent_prompts=self.task.first_prompts,
            generate=partial(self._measured_generation, rollout),
            score=partial(self.task.score, rollout.record, rows),
            transition=partial(self.task.next_prompts, rollout.record, rows),
            sync=partial(sync_turn, self.accelerator),
            worlds=self.task.worlds,
            branching=self.credit_rules.branching,
            branching_top_m=self.credit_rules.branching_top_m,
        )
        self.last_rollout = rollout.tree
        self.environments = rollout.tree.first_worlds() or None
        return rollout

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        mode, args = ("train" if self.model.training else "eval"), self.args
        k = self.num_generations if mode == "train" else self.num_generations_eval
        rows = inputs[::k]  # the sampler repeats each prompt K times; a tree grows once per prompt
        rollout = self._rollout(rows, k)
        tree = rollout.tree
        returns, credited, advantages, columns = self._advantages(tree, rows, mode)

        # Every process gets the same row count per agent (inert rows pad the rest), so that the log-prob passes and
        # the micro-batches run the same forwards everywhere.
        rows_per_agent = max_over_processes(self.accelerator, len(tree.nodes) * k)
        agent_batches, tokens, sampling = [], 0, {}
        for i in range(self.num_agents):
            eos = self.agent_eos_token_ids[i] if self.mask_truncated_completions else None
            pad, device = self.tokenizers[i].pad_token_id, self.accelerator.device
            batch = tree_rows(tree, i, advantages, pad, eos, self._corrects_sampling(i), device)
            add_row_columns(batch, columns, i, advantages)
            tokens += row_tokens(batch)
            batch["num_items_in_batch"] = self.accelerator.gather(loss_mask(batch).sum()).sum()
            batch = pad_rows(batch, rows_per_agent)
            self._add_logps(i, batch, rollout.times)
            if self._corrects_sampling(i) and "old_per_token_logps" in batch:  # else the loss sets it: `RatioFromLoss`
                sampling[i] = sampling_stats(*add_importance_sampling_ratio(batch, batch["old_per_token_logps"], args))
            agent_batches.append(batch)

        self._log_rollout_metrics(mode, rollout, returns, credited, tokens)
        self._trees.record(tree, returns, credited, advantages, rollout.record, mode, self.state)  # gathers
        if sampling:
            self._log_metrics(mode, reduce_sampling_stats(gather_object([sampling])))
        if self.log_completions:  # the table GRPOTrainer's `log` prints and sends
            table = completion_log_rows(tree, advantages, rollout.record)
            self._logs = completion_logs(gather_object(table))
        return {"agents": agent_batches}

    def _advantages(self, tree: RolloutTree, rows: list[dict], mode: str) -> StepCredit:
        """The tree's returns, credited rewards and advantages (`credit.assign`, with the config's credit options):
        the one method a trainer with another estimate of the advantages overrides (the CoMLRL face's IAC and MAAC: a
        learned critic's TD advantages; IAC's value heads on the actors add columns for their loss)."""
        return StepCredit(*credit.assign(tree, self.credit_rules))

    @torch.no_grad()
    def _add_logps(self, agent: int, batch: dict, times: RolloutTimes) -> None:
        """Old-policy log-probs (only when the update is off-policy, as in GRPOTrainer) and reference log-probs, timed
        in the rollout's `times`."""
        input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
        attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        keep, chunk = batch["completion_ids"].size(1), self.update_chunk_size
        generate_every = self.args.steps_per_generation * self.num_iterations
        logps = partial(self._get_per_token_logps_and_entropies, input_ids=input_ids, attention_mask=attention_mask)
        logps = partial(logps, logits_to_keep=keep, batch_size=chunk)
        trains = agent in self.trainable_agents
        checkpointing = disable_gradient_checkpointing(self.team, self.args.gradient_checkpointing_kwargs)
        with times.phase("logps"), checkpointing:
            # As GRPOTrainer: off-policy updates, and vLLM's sampling correction, need the old policy's log-probs. Where
            # a training step's rows are on-policy, the correction takes them from the loss instead (`RatioFromLoss`).
            off_policy = self.args.gradient_accumulation_steps % generate_every != 0
            if trains and (off_policy or (self._corrects_sampling(agent) and not self.model.training)):
                with self.team.acting(agent):
                    batch["old_per_token_logps"] = logps(self.model)[0]
            if trains and self.beta != 0.0 and self.ref_team is not None:
                with self.accelerator.unwrap_model(self.ref_team).acting(agent):
                    batch["ref_per_token_logps"] = logps(self.ref_team)[0]
            elif trains and self.beta != 0.0:
                with self.team.reference(agent):
                    batch["ref_per_token_logps"] = logps(self.model)[0]

    def _log_metrics(self, mode: str, metrics: dict[str, float]) -> None:
        """Append each value to TRL's `_metrics[mode]` (a private layout, under contract), which `log` averages."""
        for key, value in metrics.items():
            self._metrics[mode][key].append(value)

    def _corrects_sampling(self, agent: int) -> bool:
        """TRL's vLLM importance-sampling correction applies to this agent's rows (it trains, vLLM sampled them)."""
        return self.use_vllm and self.vllm_importance_sampling_correction and agent in self.trainable_agents

    def _log_rollout_metrics(self, mode, rollout: Rollout, returns, credited, tokens: int) -> None:
        record, truncated, longest = rollout.record, rollout.truncated_prompts, self.max_completion_length
        stats = rollout_stats(
            rollout.tree, returns, credited, record.reward_values, record.agent_reward_values, tokens, truncated
        )
        gathered = gather_object([stats])  # one collective for every process's summary
        if mode == "train":
            self.state.num_input_tokens_seen += sum(s.tokens for s in gathered)
        self._log_metrics(mode, rollout_metrics(gathered, self.args.num_turns, record.reward_names, longest))
        self._log_metrics(mode, rollout.times.metrics(record.times))
        for name, value in record.logged_metrics:  # the rewards' `log_metric` values, as GRPOTrainer's `_metrics`
            self._log_metrics(mode, {name: value})
        self._metrics[mode]["num_tokens"] = [self.state.num_input_tokens_seen]

    def _get_per_token_logps_and_entropies(
        self,
        model,
        input_ids,
        attention_mask,
        logits_to_keep,
        batch_size=None,
        compute_entropy=False,
        compute_aux_loss=False,
        **multimodal,
    ):
        """GRPOTrainer's, on rows sorted by length in chunks trimmed of their shared padding; within a chunk, each
        distinct prompt runs once (`share_prompts`): `prefix.chunked_per_token_logps`."""
        args, stock = (model, input_ids, attention_mask, logits_to_keep), super()._get_per_token_logps_and_entropies
        if compute_aux_loss or any(v is not None for v in multimodal.values()):
            result = stock(*args, batch_size, compute_entropy, compute_aux_loss, **multimodal)
        else:
            shared = self.share_prompts and not (torch.is_grad_enabled() and uses_reentrant_checkpointing(self.team))
            chunk = batch_size or self.update_chunk_size
            logps, entropies = chunked_per_token_logps(
                *args, chunk, shared, compute_entropy, stock, self.accelerator.autocast
            )
            result = logps, entropies, None
        if self._open_loss_call is not None:  # inside TRL's `_compute_loss`: the policy's forward (`update.loss_call`)
            self._open_loss_call.observe(result[0], result[1])
        return result

    def _prepare_inputs(self, generation_batch):
        """As GRPOTrainer's, but each agent's rows are split so that every micro-batch holds every agent."""
        start = Reading.now()
        if not self.model.training:
            return self._generate_and_score_completions(generation_batch)["agents"]
        generate_every = self.args.steps_per_generation * self.num_iterations
        if self._step % generate_every == 0 or self._buffered_inputs is None:
            agent_batches = self._generate_and_score_completions(generation_batch)["agents"]
            self._buffered_inputs = split_micro_batches(agent_batches, self.args.steps_per_generation)
        micro_batch = self._buffered_inputs[self._step % self.args.steps_per_generation]
        if self._micro_step is not None:  # within `training_step`: the rollout's share of the step, apart
            tokens = sum(row_tokens(b) for i, b in enumerate(micro_batch) if i in self.trainable_agents)
            self._micro_step.prepared(Reading.now() - start, tokens)
        return micro_batch

    def training_step(self, model, inputs, num_items_in_batch):
        """GRPOTrainer's step, with the update (forward + backward) timed apart from the rollout that the Trainer's
        call of `_prepare_inputs` may run in it (`timing.MicroStep`, open for this call only)."""
        self._micro_step = step = MicroStep()
        try:
            loss = super().training_step(model, inputs, num_items_in_batch)
        finally:
            self._micro_step = None
        self._update_times.add(step.update(), step.tokens)
        if self._step % self.args.steps_per_generation == 0:  # a generation's rows have all been through the loss
            stats = self._ratio_from_loss.flush()
            if stats:
                self._log_metrics("train", reduce_sampling_stats(gather_object([stats])))
        if self._step % self.current_gradient_accumulation_steps == 0:
            self._log_metrics("train", self._update_times.flush())
        return loss

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """TRL's `_compute_loss` for each agent's rows, in agent order on every process, summed; in chunks of at most
        `update_chunk_size` rows per agent, each weighted so that the chunks add up to the micro-batch's loss.

        Every chunk but the last runs its backward here, with the gradient reduction deferred; the Trainer runs the
        last one's, which reduces (and, at the end of the accumulation window, steps) as usual. All agents' forwards
        of a chunk run inside one call of the wrapped model: DDP and DeepSpeed allow one forward per backward.
        """
        if return_outputs:
            raise ValueError("The MAGRPOTrainer does not support returning outputs")
        chunks = update_chunks(inputs, self.update_chunk_size, self.loss_type, group_prompts=self.share_prompts)
        earlier = 0.0  # the loss of the chunks already backpropagated, for the logged value
        policy_losses = []  # each agent's and chunk's loss before the entropy bonus, for its metric
        for chunk, weights in chunks[:-1]:
            with deferred_gradient_reduction(self.accelerator, model, self.is_deepspeed_enabled):
                loss = self.team.in_one_forward(model, partial(self._team_loss, chunk, weights, policy_losses))
                if torch.is_grad_enabled():
                    kwargs = {"scale_wrt_gas": False} if self.is_deepspeed_enabled else {}  # as the Trainer's backward
                    self.accelerator.backward(loss, **kwargs)
            earlier = earlier + loss.detach()
        loss = self.team.in_one_forward(model, partial(self._team_loss, *chunks[-1], policy_losses)) + earlier
        self.log_policy_loss(policy_losses)  # with the entropy bonus, as GRPOTrainer (`update.entropy`)
        return loss

    def _team_loss(
        self, inputs: list[dict], weights: list[float], policy_losses: list, forward: torch.nn.Module
    ) -> torch.Tensor:
        loss = 0.0
        for agent, (agent_inputs, weight) in enumerate(zip(inputs, weights, strict=True)):
            if agent not in self.trainable_agents:
                continue  # a frozen agent acts in rollouts but has nothing to learn
            with self.team.acting(agent):
                with self._loss_call(agent, agent_inputs) as call:
                    agent_loss = self._compute_loss(forward, agent_inputs)  # TRL's
                agent_loss = self.entropy_bonus(agent, agent_loss, agent_inputs, call.entropies, policy_losses)
            loss = loss + weight * agent_loss
        return loss

    @contextlib.contextmanager
    def _loss_call(self, agent: int, rows: dict):
        """Open for one call of TRL's `_compute_loss` on `agent`'s `rows`: the log-prob function hands it the policy's
        forward (`update.loss_call`), which sets the rows' vLLM ratio where `RatioFromLoss` computes it."""
        call = LossCall(self._ratio_from_loss.setter(agent, rows))
        self._open_loss_call = call
        try:
            yield call
        finally:
            self._open_loss_call = None
        if call.on_logps is not None and call.logps is None:  # a TRL release whose loss runs no forward of ours
            raise RuntimeError(
                f"MAGRPOTrainer: the loss of agent {agent} ran without computing the policy's log-probs; the "
                "importance-sampling ratio could not be set. Use the tested TRL release (docs/versions.md)."
            )

    def train(self, resume_from_checkpoint: str | bool | None = None, trial=None, **kwargs):
        """Trainer's `train`; `resume_from_checkpoint=True` takes the newest *complete* checkpoint
        (`checkpoint.resume_folder`); when it ends, or fails, every environment instance made that defines `close()`
        is closed, once (`environment_lifecycle`)."""
        resume_from_checkpoint = resume_folder(self.accelerator, self.args, resume_from_checkpoint)
        try:
            return super().train(resume_from_checkpoint=resume_from_checkpoint, trial=trial, **kwargs)
        finally:
            close_environments(self.task)

    def evaluate(self, *args, **kwargs):
        """Trainer's `evaluate`; called on its own (not from `train`, which closes them when it ends), the environment
        instances it made are closed after it, or when it fails (`environment_lifecycle`)."""
        try:
            return super().evaluate(*args, **kwargs)
        finally:
            if not self.is_in_train:
                close_environments(self.task)

    def _remove_unused_columns(self, dataset, description=None):
        """Every column stays, whatever `remove_unused_columns` says (`environment_lifecycle.keep_every_column`)."""
        keep_every_column(self.args)
        return dataset

    def create_optimizer(self, model=None):
        """The Trainer's optimizer; with `agent_learning_rates`, each agent's own parameter groups at its rate
        (`team.optimizer.agent_rates_optimizer`), with `KeptRatesWarning` for a resumed run."""
        rates = self.args.agent_learning_rates
        if rates is None or self.optimizer is not None:
            return super().create_optimizer(model)
        model = self.model if model is None else model
        optimizer_cls, optimizer_kwargs = getattr(
            self, "optimizer_cls_and_kwargs", None
        ) or self.get_optimizer_cls_and_kwargs(self.args, model)
        decay_names = self.get_decay_parameter_names(model)
        self.optimizer, kept_rates = agent_rates_optimizer(
            self.team, model, rates, optimizer_cls, optimizer_kwargs, decay_names, self.args
        )
        self.add_callback(kept_rates)
        return self.optimizer
