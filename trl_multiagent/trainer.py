"""`MAGRPOTrainer`: GRPOTrainer for a team of N agents trained on a joint reward, over one or more turns."""

from __future__ import annotations

import contextlib
import copy
import os
import time
from collections import defaultdict, deque
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import torch
from accelerate.utils import gather_object
from datasets import Dataset, IterableDataset
from transformers import PreTrainedTokenizerBase, TrainerState
from transformers.trainer import TRAINING_ARGS_NAME
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, rotate_checkpoints
from transformers.utils import logging
from trl import GRPOTrainer
from trl.data_utils import is_conversational
from trl.models.utils import disable_gradient_checkpointing, prepare_deepspeed
from trl.trainer.utils import add_fused_lm_head, pad

from . import arguments, checkpoint, comlrl
from .assembly import build_team, load_tokenizers, plan_team
from .batching import EpochSeededSampler, agent_rows, length_chunks, pad_rows, split_micro_batches
from .callables import Transition, callable_name, check_prompt
from .chunking import update_chunks
from .config import MAGRPOConfig
from .credit import group_advantages
from .generation import build_generator
from .generation.vllm_settings import check_vllm_team
from .importance import importance_sampling_ratio, sampling_stats
from .metrics import completion_log_rows, rollout_metrics, rollout_stats
from .prefix import shared_prompt_logps, supports_prompt_sharing, uses_reentrant_checkpointing
from .rewards import JointReward, check_agent_reward_aggregation
from .rollout import Generation, RolloutTree, local_sync, run_rollout
from .team import AgentTeam


logger = logging.get_logger(__name__)

PLACEHOLDER_ANSWER = "placeholder answer"
# Joint actions of the placeholder reward call: more than one, so that a reward returning a list of fixed length
# (`[0.0]`) fails when the trainer is built, not after the first generation.
PLACEHOLDER_JOINT_ACTIONS = 2


class MAGRPOTrainer(GRPOTrainer):
    """
    Trainer for MAGRPO: N cooperating agents, one joint reward, multi-turn tree rollouts with feedback between turns.

    What changes from [`~trl.GRPOTrainer`]:

    - the model is an [`AgentTeam`] of N policies, so one optimizer and one accelerate/DeepSpeed engine hold them all;
    - `_generate_and_score_completions` grows a rollout tree per prompt (`rollout.run_rollout`): each turn, one batched
      generation per agent over every live node (transformers `generate`, or vLLM with `use_vllm=True`: see
      `generation`), one call of the joint reward, and the transition for each branch that goes on; advantages are
      group-relative returns (`credit`);
    - `_prepare_inputs` cuts each agent's rows into micro-batches that hold every agent;
    - `compute_loss` runs TRL's own `_compute_loss` once per agent and sums the results, in chunks of at most
      `update_chunk_size` rows per agent, each with its own backward (`chunking`);
    - `_get_per_token_logps_and_entropies` runs rows sorted by length, and each distinct prompt once for the K rows
      that continue it (`share_prompts`, as does the prefill of `generate`);
    - `_save` writes `agent_{i}/` folders, and `_load_from_checkpoint` reads them back;
    - `_save_checkpoint` marks a checkpoint complete once every process has written it, before the rotation, and
      `train(resume_from_checkpoint=True)` takes the newest complete one (`checkpoint`);
    - `_get_train_sampler` seeds each epoch's prompt order by the epoch, so that a resumed run sees the same order.

    TRL's loss types, clipping, KL, logging, optimizer and accelerate preparation are used unchanged.

    Args:
        agents: models or model ids, one per agent (heterogeneous teams allowed).
        model, num_agents: alternatively one model (or id) copied `num_agents` times.
        tokenizer / processing_class: one tokenizer for every agent, or one per agent.
        reward_func / reward_funcs: reward callable(s) or reward models; weights from `args.reward_weights`. Joint
            rewards take one list of completions per agent; TRL's (`f(completions, **kwargs)`, all of `trl.rewards`,
            model ids) score each agent, combined by `args.agent_reward_aggregation` (see `rewards`).
        reward_processing_classes: the reward models' tokenizers, as in GRPOTrainer.
        quantization_config: as in GRPOTrainer, for agents loaded from ids (bitsandbytes, CUDA only).
        tools, rollout_func, environment_factory: GRPOTrainer's; refused (see `arguments.REFUSED_GRPO_ARGUMENTS`).
        external_transition: builds each agent's next prompt from a branch (needed when `num_turns > 1`).
        formatters: optional per-agent callables mapping a dataset row to that agent's first prompt (one callable
            serves every agent).
        **comlrl_arguments: CoMLRL's own names (`agent_model`, `reward_processor`, `model_config`, `wandb_config`,
            `eval_logger`, `eval_aggregator`), translated by `comlrl.trainer_arguments`.

    Example:

    ```python
    from datasets import Dataset

    from trl_multiagent import MAGRPOConfig, MAGRPOTrainer

    dataset = Dataset.from_dict({"prompt": ["Describe a city in the clouds:", "Invent a new holiday and explain it:"]})

    def ratio_reward(completions1, completions2):  # one list per agent, one value per joint answer
        return [min(len(b) / max(len(a), 1), 3.0) for a, b in zip(completions1, completions2)]

    trainer = MAGRPOTrainer(
        agents=["HuggingFaceTB/SmolLM2-135M-Instruct"] * 2,  # hub ids, saved folders or models in memory
        reward_func=ratio_reward,
        train_dataset=dataset,
        args=MAGRPOConfig(num_generations=4, per_device_train_batch_size=8, max_new_tokens=64),
    )
    trainer.train()
    ```
    """

    _tag_names = ["trl", "magrpo", "trl_multiagent"]
    _name = "MAGRPO"

    def __init__(
        self,
        agents: Sequence[str | torch.nn.Module] | None = None,
        *,
        model: str | torch.nn.Module | None = None,
        num_agents: int | None = None,
        tokenizer: PreTrainedTokenizerBase | Sequence[PreTrainedTokenizerBase] | None = None,
        processing_class: PreTrainedTokenizerBase | Sequence[PreTrainedTokenizerBase] | None = None,
        reward_func: Callable | None = None,
        reward_funcs: Callable | Sequence[Callable] | None = None,
        external_transition: Callable | None = None,
        formatters: Sequence[Callable[[dict], Any]] | None = None,
        args: MAGRPOConfig | None = None,
        train_dataset: Dataset | IterableDataset | None = None,
        eval_dataset=None,
        callbacks=None,
        optimizers=(None, None),
        peft_config=None,
        reward_processing_classes=None,
        quantization_config=None,
        tools=None,
        rollout_func=None,
        environment_factory=None,
        **comlrl_arguments,
    ):
        args = args if args is not None else MAGRPOConfig("MAGRPO")
        if not isinstance(args, MAGRPOConfig):
            raise TypeError(f"MAGRPOTrainer needs a MAGRPOConfig as `args`, got {type(args).__name__}.")
        args.check()  # again: a field may have been set after the config was built
        arguments.check_grpo_arguments(tools=tools, rollout_func=rollout_func, environment_factory=environment_factory)
        # CoMLRL's own arguments (agent_model, reward_processor, model_config, wandb_config, ...): see `comlrl`
        resolved = comlrl.trainer_arguments(
            comlrl_arguments, args, agents=agents, model=model, num_agents=num_agents, formatters=formatters,
            eval_dataset=eval_dataset,
        )  # fmt: skip
        args, model, num_agents, formatters, eval_dataset = (
            resolved[k] for k in ("args", "model", "num_agents", "formatters", "eval_dataset")
        )
        self.comlrl_evaluation = resolved["evaluation"]

        # Everything that can be checked without loading a model is checked first.
        plan = plan_team(agents, model, num_agents, tokenizer if tokenizer is not None else processing_class,
                         peft_config, args.trainable_agents)  # fmt: skip
        n = plan.num_agents
        check_agent_reward_aggregation(args.agent_reward_aggregation, n)
        agent_init_kwargs = arguments.quantized_model_init_kwargs(
            quantization_config, args.model_init_kwargs, plan.specs
        )
        if args.use_vllm:
            check_vllm_team(args, n, plan.shared_base, lora=plan.peft_configs is not None)
        if reward_func is not None and reward_funcs is not None:
            raise ValueError("MAGRPOTrainer: pass `reward_func` or `reward_funcs`, not both.")
        funcs = reward_funcs if reward_funcs is not None else reward_func
        funcs = [] if funcs is None else list(funcs) if isinstance(funcs, (list, tuple)) else [funcs]
        columns = [c for d in (train_dataset, eval_dataset) for c in (getattr(d, "column_names", None) or [])]
        columns = [c for c in columns if c != "prompt"]
        arguments.check_column_names(columns, {*JointReward.KEYWORDS, *Transition.REQUIRED, *Transition.HISTORY})
        self.joint_reward = JointReward(
            funcs, args.reward_weights, n, columns, resolved["reward_processor"], args.agent_reward_aggregation
        )
        if formatters is not None and len(formatters) != n:
            raise ValueError(f"MAGRPOTrainer got {len(formatters)} formatters for {n} agents; pass one per agent.")
        self.formatters = list(formatters) if formatters is not None else None
        self.formats_later_turns = comlrl.formats_later_turns(self.formatters, args)
        for name, dataset in (("train_dataset", train_dataset), ("eval_dataset", eval_dataset)):
            arguments.check_dataset(name, dataset, formatters is not None)
        arguments.check_dataset_fills_a_step(train_dataset, args)
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
        self.transition = (
            Transition(external_transition, n, conversational, columns) if external_transition is not None else None
        )
        self.num_agents = n
        first_row = None
        if train_dataset is not None:
            first_row = next(iter(train_dataset), None)
            if first_row is None:
                raise ValueError("MAGRPOTrainer: train_dataset is empty (no row); it needs at least one prompt.")
        # The tokenizers are small, and the first prompts need them (chat messages need a chat template): they are
        # loaded before the models, and the first prompts and user functions are checked still before any model.
        self.tokenizers = load_tokenizers(plan)
        comlrl.add_special_tokens(self.tokenizers, resolved["special_tokens"])
        if isinstance(eval_dataset, (Dataset, IterableDataset)):
            eval_row = next(iter(eval_dataset), None)
            if eval_row is not None:
                self._first_prompts(eval_row)
        if first_row is not None:
            prompts = self._first_prompts(first_row)
            if args.check_functions_before_training:
                self._check_user_functions(first_row, prompts, args.num_turns)

        built = build_team(plan, self.tokenizers, agent_init_kwargs)
        reward_funcs = arguments.load_reward_models(
            self.joint_reward.funcs, args.model_init_kwargs, args.distributed_state.distributed_type != "NO"
        )
        self.team, self.agent_eos_token_ids = built.team, built.eos_token_ids
        self.trainable_agents = plan.trainable

        # GRPOTrainer would build a reference model from a hub id, and one vLLM engine for one policy; each agent's
        # reference and the team's engines are built below instead. The models are loaded: GRPOTrainer would warn
        # that `model_init_kwargs` is ignored, though `build_team` just used it.
        beta, args.beta = args.beta, 0.0
        use_vllm, args.use_vllm = args.use_vllm, False
        model_init_kwargs, args.model_init_kwargs = args.model_init_kwargs, None
        try:
            super().__init__(
                model=self.team,
                reward_funcs=reward_funcs,
                args=args,
                train_dataset=train_dataset,
                eval_dataset=eval_dataset,
                processing_class=self.tokenizers[0],
                reward_processing_classes=reward_processing_classes,
                callbacks=callbacks,
                optimizers=optimizers,
            )
        finally:
            args.beta, args.use_vllm, args.model_init_kwargs = beta, use_vllm, model_init_kwargs
        self.beta, self.use_vllm = beta, use_vllm
        self.joint_reward.bind_models(self.reward_funcs, self.reward_processing_classes)
        for callback in resolved["callbacks"]:
            self.add_callback(callback)
        # GRPOTrainer patched its fused log-prob head onto the container; it belongs on each agent instead.
        del self.team.forward
        for agent in self.team.agents:
            base = agent.get_base_model() if hasattr(agent, "get_base_model") else agent
            add_fused_lm_head(base, temperature=self.temperature, outputs=("log_probs", "entropy"))
        self.share_prompts = args.share_prompts and all(supports_prompt_sharing(a) for a in self.team.agents)
        if args.share_prompts and not self.share_prompts:
            plain = [i for i in range(n) if not supports_prompt_sharing(self.team.agent(i))]
            logger.warning_once(
                f"MAGRPOTrainer: share_prompts=True, but agent(s) {plain} cannot share a prompt's keys and values (it "
                "needs a rotary model with full attention whose forward takes `cache`, as in transformers 5.24, and "
                "no prompt-learning adapter); every agent uses the plain computation. The results are the same, only "
                "slower."
            )
        # Adapter agents use their base (adapter disabled) as reference, at no extra memory; full models need a copy.
        self.ref_team = self._build_reference() if beta != 0.0 and not self.team.all_adapters else None

        self.update_chunk_size = args.update_chunk_size or args.per_device_train_batch_size
        self.generator = build_generator(self)
        self._update_seconds, self._update_tokens = 0.0, 0

    # ------------------------------------------------------------------ set-up helpers

    def _build_reference(self) -> AgentTeam:
        """A frozen copy of every agent, taken before training, for the KL term when `beta > 0`."""
        reference = copy.deepcopy(self.accelerator.unwrap_model(self.model))
        reference.requires_grad_(False)
        reference.eval()
        if self.is_deepspeed_enabled:
            return prepare_deepspeed(reference, self.accelerator)  # sharded like the policy under ZeRO-3
        return self.accelerator.prepare_model(reference, evaluation_mode=True)

    def _check_user_functions(self, row: dict, prompts: list, num_turns: int) -> None:
        """Call the reward and the transition once with placeholder answers (the row's first `prompts`), before any
        generation."""
        count = PLACEHOLDER_JOINT_ACTIONS
        answers = [[PLACEHOLDER_ANSWER] * count for _ in range(self.num_agents)]
        ids = [[t.encode(PLACEHOLDER_ANSWER, add_special_tokens=False)] * count for t in self.tokenizers]
        keywords = self._reward_keywords([row] * count, [prompts] * count, turn=1)
        with _placeholder_call(f"the joint reward {self.joint_reward.names} ({count} joint actions)"):
            self.joint_reward(answers, 1, keywords, ids)
        if self.transition is not None and num_turns > 1:
            branch = [a[0] for a in answers]  # the first joint action goes on to turn 2
            history = {
                "prompt_history_per_agent": [[p] for p in prompts],
                "response_history_per_agent": [[a] for a in branch],
                "reward": 0.0,
                **_columns(row),
            }
            with _placeholder_call(f"external_transition {self.transition.name!r} (one branch, after turn 1)"):
                self._transitions([row], [(row.get("prompt"), branch, history)], 1)

    # ------------------------------------------------------------------ rollout

    def _first_prompts(self, row: dict) -> list:
        if self.formatters is None:
            check_prompt(f"The dataset row {_short_row(row)}'s 'prompt'", row["prompt"], conversational=True)
            prompts, source = [row["prompt"]] * self.num_agents, f"the dataset row {_short_row(row)}"
        else:
            prompts = [f(row) for f in self.formatters]
            for i, prompt in enumerate(prompts):
                check_prompt(f"formatters[{i}] (agent {i}) on the row {_short_row(row)}: its result", prompt, True)
            source = f"its formatter on the row {_short_row(row)}"
        self._check_chat_templates(prompts, source)
        return prompts

    def _check_chat_templates(self, prompts: list, source: str) -> None:
        """Chat messages go only to an agent whose tokenizer has a chat template: transformers would fail at the
        first generation, naming no agent."""
        for i, prompt in enumerate(prompts):
            tokenizer = self.tokenizers[i]
            if is_conversational({"prompt": prompt}) and getattr(tokenizer, "chat_template", None) is None:
                name = getattr(tokenizer, "name_or_path", "")
                raise ValueError(
                    f"MAGRPOTrainer: agent {i}'s prompt from {source} is a list of chat messages, but agent {i}'s "
                    f"tokenizer{f' ({name!r})' if name else ''} has no chat template (`tokenizer.chat_template` is "
                    "None) to turn them into tokens. Give the agents plain-text prompts "
                    "(the recipes' `--prompt_format plain`), or a tokenizer with a chat template (an instruct "
                    "model's, or set `tokenizer.chat_template`)."
                )

    def _generate(self, agent: int, prompts: list, num_generations: int) -> Generation:
        """Sample `num_generations` completions for every prompt with one batched call of the generation backend."""
        start = time.perf_counter()
        greedy = not self.model.training and not self.args.eval_do_sample
        generation = self.generator.generate(agent, prompts, num_generations, greedy)
        if prompts:
            self._phase_time["generate"] += time.perf_counter() - start
            self._generated_tokens += sum(len(c) for c in generation.completion_ids)
        return generation

    def _reward_keywords(self, rows: list[dict], prompts: list[list], turn: int) -> dict[str, Any]:
        """Keywords a joint reward may take: per-agent prompts, the dataset columns, and the trainer state."""
        keywords = {"prompts": [[p[i] for p in prompts] for i in range(self.num_agents)]}
        # A fresh state for the placeholder call made before the Trainer exists.
        keywords["trainer_state"] = self.state if hasattr(self, "state") else TrainerState()
        keywords["batch_items"] = rows  # CoMLRL's name for the dataset row of each joint action
        for key in rows[0]:
            if key != "prompt":  # the columns cannot shadow a keyword: `arguments.check_column_names`
                keywords[key] = [row.get(key) for row in rows]
        return keywords

    def _score(self, rows: list[dict], turn: int, tree: RolloutTree, action_ids: list[int]) -> list[float]:
        start = time.perf_counter()
        answers = [tree.answers(a) for a in action_ids]
        completions = [[ans[i] for ans in answers] for i in range(self.num_agents)]
        actions = [tree.joint_actions[a] for a in action_ids]
        nodes = [tree.nodes[a.node] for a in actions]
        ids = [[nd.completion_ids[i][a.choice[i]] for a, nd in zip(actions, nodes)] for i in range(self.num_agents)]
        keywords = self._reward_keywords([rows[nd.row] for nd in nodes], [nd.prompts for nd in nodes], turn)
        rewards, per_func, per_agent = self.joint_reward(completions, turn, keywords, ids)
        self._phase_time["reward"] += time.perf_counter() - start
        for f, values in enumerate(per_func):
            self._reward_values[turn][f].extend(v for v in values if v is not None)
        for f, agents in per_agent.items():
            for i, values in enumerate(agents):
                self._agent_reward_values[(f, i)].extend(v for v in values if v is not None)
        for a, values in zip(action_ids, zip(*per_func)):
            self._action_rewards[a] = values  # per function, for the completions table
        return rewards

    def _next_prompts(self, rows: list[dict], turn: int, tree: RolloutTree, action_ids: list[int]) -> list[list]:
        """The transition of every branch that goes on (async transitions run concurrently)."""
        start = time.perf_counter()
        branch_rows, calls = [], []
        for action_id in action_ids:
            row = rows[tree.nodes[tree.joint_actions[action_id].node].row]
            prompt_history, response_history = tree.history(action_id)
            history = {
                "prompt_history_per_agent": prompt_history,
                "response_history_per_agent": response_history,
                "reward": tree.joint_actions[action_id].reward,
                **_columns(row),
            }
            branch_rows.append(row)
            calls.append((row.get("prompt"), tree.answers(action_id), history))
        prompts = self._transitions(branch_rows, calls, turn)
        self._phase_time["transition"] += time.perf_counter() - start
        return prompts

    def _transitions(self, rows: list[dict], calls: list[tuple], turn: int) -> list[list]:
        """The next prompts of each branch: the transition's for `calls` (`(prompt, agent_completions, history)`, of
        the dataset `rows`), through CoMLRL's formatters where they apply, each checked against its agent."""
        prompts = self.transition.many(calls, turn)
        if self.formats_later_turns:  # CoMLRL's formatters(row, external_prompts=...), see `comlrl`
            prompts = [self._formatted(row, p, turn + 1) for row, p in zip(rows, prompts, strict=True)]
        formatted = " and the formatters" if self.formats_later_turns else ""
        for branch in prompts:
            self._check_chat_templates(
                branch, f"external_transition {self.transition.name!r}{formatted} after turn {turn}"
            )
        return prompts

    def _formatted(self, row: dict, prompts: list, turn: int) -> list:
        formatted = comlrl.format_later_turn(self.formatters, row, prompts)
        for i, prompt in enumerate(formatted):
            check_prompt(f"formatters[{i}] (agent {i}) at turn {turn}, on the row {_short_row(row)}", prompt, True)
        return formatted

    def _sync_turn(self, has_live_nodes: bool, error: BaseException | None) -> bool:
        """End-of-turn agreement across processes: another turn if any process has live nodes; stop all on failure."""
        if self.accelerator.num_processes == 1:
            return local_sync(has_live_nodes, error)
        flags = torch.tensor([int(has_live_nodes), int(error is not None)], device=self.accelerator.device)
        live_anywhere, failures = self.accelerator.reduce(flags, reduction="sum").tolist()
        if failures:
            messages = gather_object([None if error is None else f"{type(error).__name__}: {error}"])
            if error is not None:
                raise error
            failed = {rank: msg for rank, msg in enumerate(messages) if msg is not None}
            raise RuntimeError(f"MAGRPOTrainer: the rollout failed on process(es) {sorted(failed)}: {failed}")
        return bool(live_anywhere)

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        mode = "train" if self.model.training else "eval"
        k = self.num_generations if mode == "train" else self.num_generations_eval
        rows = inputs[::k]  # the sampler repeats each prompt K times; a tree grows once per prompt
        self._phase_time = dict.fromkeys(("sync", "generate", "reward", "transition", "logps"), 0.0)
        self._generated_tokens = 0
        self.generator.truncated_prompts = 0
        start = time.perf_counter()
        self.generator.sync_weights(self.state.global_step)  # only after the weights changed
        self._phase_time["sync"] = time.perf_counter() - start
        # turn -> per reward function, the values it returned (for `turn_{t}/rewards/{name}/mean`)
        self._reward_values = {t: [[] for _ in self.joint_reward.names] for t in range(1, self.args.num_turns + 1)}
        self._agent_reward_values = defaultdict(list)  # (function, agent) -> a per-agent reward's values
        self._action_rewards = {}  # joint action id -> each function's joint value

        tree = run_rollout(
            rows,
            num_agents=self.num_agents,
            num_generations=k,
            num_turns=self.args.num_turns,
            joint_mode=self.args.joint_mode,
            termination_threshold=self.args.early_termination_threshold,
            agent_prompts=self._first_prompts,
            generate=partial(self._generate, num_generations=k),
            score=partial(self._score, rows),
            transition=partial(self._next_prompts, rows),
            sync=self._sync_turn,
        )
        returns = tree.returns(self.args.discount)
        credited = torch.stack(tree.completion_returns(returns))  # (nodes, agents, K)
        advantages = group_advantages(
            credited.flatten(0, 1), self.scale_rewards, self.args.advantage_baseline
        ).view_as(credited)

        # Every process gets the same row count per agent (inert rows pad the rest), so that the log-prob passes and
        # the micro-batches run the same forwards everywhere.
        rows_per_agent = self._rows_per_agent(len(tree.nodes) * k)
        agent_batches, tokens, sampling = [], 0, []
        for i in range(self.num_agents):
            prompt_ids = [node.prompt_ids[i] for node in tree.nodes for _ in range(k)]
            completion_ids = [ids for node in tree.nodes for ids in node.completion_ids[i]]
            batch = agent_rows(
                prompt_ids, completion_ids, advantages[:, i].flatten(), self.tokenizers[i].pad_token_id,
                self.accelerator.device,
            )  # fmt: skip
            if self.mask_truncated_completions:
                ends_with_eos = [ids[-1] in self.agent_eos_token_ids[i] for ids in completion_ids]
                batch["completion_mask"] *= torch.tensor(ends_with_eos, device=batch["completion_mask"].device)[
                    :, None
                ]
            tokens += int(batch["prompt_mask"].sum() + batch["completion_mask"].sum())
            batch["num_items_in_batch"] = self.accelerator.gather(batch["completion_mask"].sum()).sum()
            if self._corrects_sampling(i):
                logps = [torch.tensor(lp) for node in tree.nodes for lp in node.sampling_logps[i]]
                batch["sampling_per_token_logps"] = pad(logps, padding_value=0.0, padding_side="right").to(
                    batch["completion_mask"].device
                )
            batch = pad_rows(batch, rows_per_agent)
            self._add_logps(i, batch)
            if self._corrects_sampling(i):
                sampling.append(self._add_importance_sampling_ratio(batch))
            agent_batches.append(batch)

        self._log_rollout_metrics(mode, tree, returns, credited, tokens)
        self._log_sampling_metrics(mode, sampling)
        if self.log_completions:
            self._log_completion_rows(tree, advantages)
        if mode == "eval" and self.comlrl_evaluation is not None:  # CoMLRL's eval_logger and eval_aggregator
            for key, value in self.comlrl_evaluation(tree, rows, self.args.num_turns).items():
                self._metrics[mode][key].append(value)
        return {"agents": agent_batches}

    def _log_completion_rows(self, tree: RolloutTree, advantages: torch.Tensor) -> None:
        """This generation's completions, for the table GRPOTrainer's `log` prints and sends (`log_completions`)."""
        rows = gather_object(completion_log_rows(tree, advantages, self._action_rewards, self.joint_reward.names))
        self._logs = {
            "images": deque(),
            "prompt": deque(row["prompt"] for row in rows),
            "completion": deque(row["completion"] for row in rows),
            "rewards": {name: deque(row["rewards"][name] for row in rows) for name in self.joint_reward.names},
            "advantages": deque(row["advantage"] for row in rows),
            "extra": {column: deque(row[column] for row in rows) for column in ("agent", "turn")},
        }

    @torch.no_grad()
    def _add_logps(self, agent: int, batch: dict) -> None:
        """Old-policy log-probs (only when the update is off-policy, as in GRPOTrainer) and reference log-probs."""
        start = time.perf_counter()
        input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
        attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        logits_to_keep = batch["completion_ids"].size(1)
        chunk = self.update_chunk_size
        generate_every = self.args.steps_per_generation * self.num_iterations
        logps = partial(
            self._get_per_token_logps_and_entropies,
            input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=logits_to_keep, batch_size=chunk,
        )  # fmt: skip
        trains = agent in self.trainable_agents
        with disable_gradient_checkpointing(self.team, self.args.gradient_checkpointing_kwargs):
            # As GRPOTrainer: off-policy updates, and vLLM's sampling correction, need the old policy's log-probs.
            off_policy = self.args.gradient_accumulation_steps % generate_every != 0
            if trains and (off_policy or self._corrects_sampling(agent)):
                with self.team.acting(agent):
                    batch["old_per_token_logps"] = logps(self.model)[0]
            if trains and self.beta != 0.0 and self.ref_team is not None:
                with self.accelerator.unwrap_model(self.ref_team).acting(agent):
                    batch["ref_per_token_logps"] = logps(self.ref_team)[0]
            elif trains and self.beta != 0.0:
                with self.team.reference(agent):
                    batch["ref_per_token_logps"] = logps(self.model)[0]
        self._phase_time["logps"] += time.perf_counter() - start

    def _corrects_sampling(self, agent: int) -> bool:
        """TRL's vLLM importance-sampling correction applies to this agent's rows (it trains, vLLM sampled them)."""
        return self.use_vllm and self.vllm_importance_sampling_correction and agent in self.trainable_agents

    def _add_importance_sampling_ratio(self, batch: dict) -> dict[str, float]:
        """`importance_sampling_ratio` for TRL's loss, from the old-policy and the sampler's log-probs."""
        old, sampled = batch["old_per_token_logps"], batch.pop("sampling_per_token_logps")
        mask = batch["completion_mask"]
        ratio = importance_sampling_ratio(
            old, sampled, mask, self.vllm_importance_sampling_mode, self.vllm_importance_sampling_clip_min,
            self.vllm_importance_sampling_clip_max,
        )  # fmt: skip
        batch["importance_sampling_ratio"] = ratio
        return sampling_stats(old, sampled, mask, ratio)

    # ------------------------------------------------------------------ metrics

    def _log_sampling_metrics(self, mode: str, per_agent: list[dict[str, float]]) -> None:
        """TRL's `sampling/*` metrics over every corrected agent, and `agent_{i}/sampling/*` for each."""
        if not per_agent:
            return
        agents = [i for i in range(self.num_agents) if self._corrects_sampling(i)]
        gathered = gather_object([per_agent])  # [process][agent] -> stats
        reduce = {"min": min, "max": max, "mean": lambda values: sum(values) / len(values)}
        for key in per_agent[0]:
            how = reduce[key.rsplit("/", 1)[1]]
            for slot, agent in enumerate(agents):
                values = [p[slot][key] for p in gathered if p[slot][key] == p[slot][key]]  # NaN: no real token
                if values:
                    self._metrics[mode][f"agent_{agent}/sampling/{key}"].append(how(values))
            values = [p[s][key] for p in gathered for s in range(len(agents)) if p[s][key] == p[s][key]]
            if values:
                self._metrics[mode][f"sampling/{key}"].append(how(values))

    def _log_rollout_metrics(self, mode, tree: RolloutTree, returns, credited, tokens: int) -> None:
        lengths = [[len(ids) for node in tree.nodes for ids in node.completion_ids[i]] for i in range(self.num_agents)]
        stats = rollout_stats(tree, returns, credited, lengths, self._reward_values, dict(self._agent_reward_values))
        metrics = rollout_metrics(
            gather_object([stats]), self.args.num_turns, self.joint_reward.names, self.max_completion_length
        )
        for key, value in metrics.items():
            self._metrics[mode][key].append(value)

        if mode == "train":
            tokens = torch.tensor(tokens, device=self.accelerator.device)
            self.state.num_input_tokens_seen += int(self.accelerator.gather(tokens).sum())
        self._metrics[mode]["num_tokens"] = [self.state.num_input_tokens_seen]
        for phase, seconds in self._phase_time.items():
            self._metrics[mode][f"timing/{phase}_s"].append(seconds)
        truncated = torch.tensor(self.generator.truncated_prompts, device=self.accelerator.device)
        self._metrics[mode]["prompts/truncated"].append(int(self.accelerator.gather(truncated).sum()))
        if self._phase_time["generate"] > 0:
            throughput = self._generated_tokens / self._phase_time["generate"]
            self._metrics[mode]["throughput/generate_tokens_per_s"].append(throughput)

    # ------------------------------------------------------------------ training step

    def _get_per_token_logps_and_entropies(
        self, model, input_ids, attention_mask, logits_to_keep, batch_size=None, compute_entropy=False,
        compute_aux_loss=False, **multimodal,
    ):  # fmt: skip
        """GRPOTrainer's, on rows sorted by length in chunks trimmed of their shared padding; within a chunk, each
        distinct prompt runs once (`share_prompts`, see `prefix.shared_prompt_logps`).

        Tree rows differ a lot in length (second-turn prompts carry the feedback), so padding every row to the longest
        wastes compute, and the K rows of a node repeat its prompt. Rotary position embeddings make both exact up to
        float rounding.
        """
        if compute_aux_loss or any(v is not None for v in multimodal.values()):
            return super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy, compute_aux_loss,
                **multimodal,
            )  # fmt: skip
        prompt_width = input_ids.size(1) - logits_to_keep
        chunk_rows = batch_size or self.update_chunk_size
        shared = self.share_prompts and not (torch.is_grad_enabled() and uses_reentrant_checkpointing(self.team))
        logps, entropies, rows = [], [], []
        chunks = length_chunks(input_ids, attention_mask, logits_to_keep, chunk_rows, group_prompts=shared)
        for chunk, start, keep in chunks:
            if shared:
                prompt, completion = slice(start, prompt_width), slice(prompt_width, prompt_width + keep)
                with self.accelerator.autocast():
                    chunk_logps, chunk_entropies = shared_prompt_logps(
                        model, input_ids[chunk, prompt], attention_mask[chunk, prompt], input_ids[chunk, completion],
                        attention_mask[chunk, completion],
                    )  # fmt: skip
            else:
                columns = slice(start, prompt_width + keep)
                chunk_logps, chunk_entropies, _ = super()._get_per_token_logps_and_entropies(
                    model, input_ids[chunk, columns], attention_mask[chunk, columns], keep,
                    compute_entropy=compute_entropy,
                )  # fmt: skip
            logps.append(torch.nn.functional.pad(chunk_logps, (0, logits_to_keep - keep)))
            if compute_entropy:
                entropies.append(torch.nn.functional.pad(chunk_entropies, (0, logits_to_keep - keep)))
            rows.append(chunk)
        inverse = torch.argsort(torch.cat(rows))
        return torch.cat(logps)[inverse], torch.cat(entropies)[inverse] if compute_entropy else None, None

    def _get_train_sampler(self, dataset=None):
        """GRPOTrainer's sampler, with each epoch's prompt order seeded by the epoch: a resumed run sees the same order."""
        return EpochSeededSampler(super()._get_train_sampler(dataset))

    def _prepare_inputs(self, generation_batch):
        """As GRPOTrainer's, but each agent's rows are split so that every micro-batch holds every agent."""
        start = time.perf_counter()
        if not self.model.training:
            return self._generate_and_score_completions(generation_batch)["agents"]
        generate_every = self.args.steps_per_generation * self.num_iterations
        if self._step % generate_every == 0 or self._buffered_inputs is None:
            agent_batches = self._generate_and_score_completions(generation_batch)["agents"]
            self._buffered_inputs = split_micro_batches(agent_batches, self.args.steps_per_generation)
        micro_batch = self._buffered_inputs[self._step % self.args.steps_per_generation]
        self._rollout_seconds = time.perf_counter() - start
        self._micro_batch_tokens = sum(
            int(b["prompt_mask"].sum() + b["completion_mask"].sum())
            for i, b in enumerate(micro_batch)
            if i in self.trainable_agents
        )
        return micro_batch

    def training_step(self, model, inputs, num_items_in_batch):
        """GRPOTrainer's step, with the update (forward + backward) timed apart from the rollout."""
        start = time.perf_counter()
        loss = super().training_step(model, inputs, num_items_in_batch)
        self._update_seconds += time.perf_counter() - start - self._rollout_seconds
        self._update_tokens += self._micro_batch_tokens
        if self._step % self.current_gradient_accumulation_steps == 0:
            self._metrics["train"]["timing/update_s"].append(self._update_seconds)
            self._metrics["train"]["throughput/update_tokens_per_s"].append(
                self._update_tokens / max(self._update_seconds, 1e-9)
            )
            self._update_seconds, self._update_tokens = 0.0, 0
        return loss

    def _rows_per_agent(self, rows: int) -> int:
        """The largest row count of an agent on any process (every agent has the same count: K per node)."""
        if self.accelerator.num_processes == 1:
            return rows
        count = torch.tensor([rows], device=self.accelerator.device)
        return int(self.accelerator.reduce(count, reduction="max").item())

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
        for chunk, weights in chunks[:-1]:
            with self._deferred_gradient_reduction(model):
                loss = model(run=partial(self._team_loss, chunk, weights))
                if torch.is_grad_enabled():
                    kwargs = {"scale_wrt_gas": False} if self.is_deepspeed_enabled else {}  # as the Trainer's backward
                    self.accelerator.backward(loss, **kwargs)
            earlier = earlier + loss.detach()
        chunk, weights = chunks[-1]
        return model(run=partial(self._team_loss, chunk, weights)) + earlier

    @contextlib.contextmanager
    def _deferred_gradient_reduction(self, model):
        """No gradient reduction in this block: DDP's `no_sync`, and DeepSpeed outside its accumulation boundary
        (accelerate's backward then neither reduces nor steps the engine)."""
        state = self.accelerator.gradient_state
        sync_gradients = state.sync_gradients
        state._set_sync_gradients(False)
        try:
            with contextlib.nullcontext() if self.is_deepspeed_enabled else self.accelerator.no_sync(model):
                yield
        finally:
            state._set_sync_gradients(sync_gradients)

    def _team_loss(self, inputs: list[dict], weights: list[float], team: AgentTeam) -> torch.Tensor:
        loss = 0.0
        for agent, (agent_inputs, weight) in enumerate(zip(inputs, weights)):
            if agent not in self.trainable_agents:
                continue  # a frozen agent acts in rollouts but has nothing to learn
            with team.acting(agent):
                loss = loss + weight * self._compute_loss(team, agent_inputs)
        return loss

    # ------------------------------------------------------------------ saving and resuming

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        """Write `agent_{i}/` for each agent: full weights, or a PEFT adapter; with its tokenizer.

        Full weights load with `AutoModelForCausalLM.from_pretrained(dir/agent_i)`, adapters with
        `PeftModel.from_pretrained(base, dir/agent_i)`.
        """
        output_dir = output_dir if output_dir is not None else self.args.output_dir
        if not self.args.should_save:
            return
        os.makedirs(output_dir, exist_ok=True)
        for i in range(self.num_agents):
            agent_dir = checkpoint.agent_dir(output_dir, i)
            if self.team.is_shared_base:
                # PEFT writes a named adapter into `<dir>/<name>/`, and the adapters are named `agent_{i}`.
                self.team.agent(i).save_pretrained(
                    output_dir, selected_adapters=[self.team.adapter_names[i]],
                    state_dict=checkpoint.agent_state_dict(state_dict, 0),
                )  # fmt: skip
            else:
                self.team.agent(i).save_pretrained(agent_dir, state_dict=checkpoint.agent_state_dict(state_dict, i))
            self.tokenizers[i].save_pretrained(agent_dir)
        torch.save(self.args, os.path.join(output_dir, TRAINING_ARGS_NAME))

    def save_merged_model(self, output_dir: str) -> None:
        """Write `agent_{i}/` as full weights, each adapter merged into (a copy of) its base model.

        For adapter agents (`peft_config`); full-model agents are saved as they are. Not under ZeRO-3.
        """
        team = self.accelerator.unwrap_model(self.model)
        for i in range(self.num_agents):
            agent_dir = checkpoint.agent_dir(output_dir, i)
            module = team.agent(i)
            if hasattr(module, "merge_and_unload"):
                merged = copy.deepcopy(module)
                adapter = team.adapter_names[i] if team.is_shared_base else None
                module = merged.merge_and_unload(adapter_names=[adapter] if adapter else None)
            module.save_pretrained(agent_dir)
            self.tokenizers[i].save_pretrained(agent_dir)

    def train(self, resume_from_checkpoint: str | bool | None = None, trial=None, **kwargs):
        """Trainer's `train`; `resume_from_checkpoint=True` takes the newest *complete* checkpoint (see `checkpoint`)."""
        if resume_from_checkpoint:
            resume_from_checkpoint = checkpoint.resolve_resume(self.args.output_dir, resume_from_checkpoint)
        return super().train(resume_from_checkpoint=resume_from_checkpoint, trial=trial, **kwargs)

    def _save_checkpoint(self, model, trial) -> None:
        """Trainer's, then the completion marker once every process has written its files, then the rotation.

        Rotating after the marker means `save_total_limit` never deletes a complete checkpoint while the newest one
        is still being written.
        """
        save_total_limit, self.args.save_total_limit = self.args.save_total_limit, None
        try:
            super()._save_checkpoint(model, trial)
        finally:
            self.args.save_total_limit = save_total_limit
        run_dir = self._get_output_dir(trial=trial)
        self.accelerator.wait_for_everyone()
        if self.args.should_save:
            checkpoint.mark_complete(os.path.join(run_dir, f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"))
            rotate_checkpoints(
                output_dir=run_dir, save_total_limit=save_total_limit,
                best_model_checkpoint=self.state.best_model_checkpoint, use_mtime=True,
            )  # fmt: skip

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model=None) -> None:
        team = self.accelerator.unwrap_model(model if model is not None else self.model)
        for i in range(self.num_agents):
            folder = checkpoint.agent_dir(resume_from_checkpoint, i)
            if team.is_shared_base:
                checkpoint.load_adapter_weights(team.agent(i), folder, team.adapter_names[i])
            elif hasattr(team.agent(i), "peft_config"):
                checkpoint.load_adapter_weights(team.agent(i), folder, "default")
            else:
                checkpoint.load_agent_weights(team.agent(i), folder)


# ---------------------------------------------------------------------- module helpers


def _is_conversational_dataset(dataset) -> bool:
    if dataset is None or "prompt" not in (getattr(dataset, "column_names", None) or []):
        return False
    first = next(iter(dataset), None)
    return first is not None and is_conversational(first)


@contextlib.contextmanager
def _placeholder_call(function: str):
    """Say where an error of the placeholder call comes from: raised while the trainer is built, it would look like
    a fault of the trainer's own set-up. The user's exception type is kept."""
    try:
        yield
    except Exception as err:
        note = (
            f"MAGRPOTrainer: this came from the check that calls {function} once when the trainer is built, before "
            f"any generation: on the first training row, with the placeholder answer {PLACEHOLDER_ANSWER!r} from every "
            "agent. Make it handle any text an agent may write, or skip this check with "
            "MAGRPOConfig(check_functions_before_training=False)."
        )
        if hasattr(err, "add_note"):  # Python 3.11+
            err.add_note(note)
        else:
            logger.error(note)
        raise


def _short_row(row: dict, limit: int = 120) -> str:
    text = repr(row)
    return text if len(text) <= limit else text[:limit] + "...}"


def _columns(row: dict) -> dict:
    return {k: v for k, v in row.items() if k not in ("prompt", "turn", "reward", "num_agents", "agent_completions")}
