"""CoMLRL 1.4.3's `MAGRPOTrainer` on the TRL face's trainer: CoMLRL's arguments, in its order, translated once into
the TRL face's, and its calls of the user's functions (`comlrl.rewards`)."""

from __future__ import annotations

import functools
import shutil
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch
from datasets import Dataset
from transformers import TrainerCallback, TrainerState
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from transformers.utils import logging

from ..arguments.datasets import check_dataset_fills_a_step
from ..checkpoint import COMPLETE_MARKER, is_complete, resolve_resume
from ..environment_lifecycle import close_environments
from ..trainer import MAGRPOTrainer as TRLFaceTrainer
from .arguments import (
    add_special_tokens,
    check_agent_model_names,
    model_config_keywords,
    wandb_reporting,
)
from .checkpoints import (
    CHECKPOINT_VERSION,
    check_checkpoint_dir,
    check_own,
    completed_epochs,
    metadata_of,
    prune,
    replace_folder,
    wandb_identity,
    write_metadata,
)
from .config import MAGRPOConfig, check_late_changes, fit_to_prompts, say_early_termination, undiscounted
from .evaluation import EvaluatedPaths, Evaluation, trainer_log_keys, turn_metrics
from .rewards import comlrl_reward, comlrl_transition


logger = logging.get_logger(__name__)


class FixedWhenBuilt(property):
    """A CoMLRL attribute read from what the trainer was built with. CoMLRL's trainer would use a new value; here
    setting it would have no effect, so it is refused, naming it."""

    def __set_name__(self, owner, name):
        self.name = name

    def __set__(self, trainer, value):
        raise AttributeError(
            f"MAGRPOTrainer.{self.name} is fixed when the trainer is built (setting it would have no effect here); "
            "pass it to MAGRPOTrainer(...) instead."
        )


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
    - `_prepare_arguments` adds the tokens of `model_config["special_tokens"]`;
    - `evaluate` is CoMLRL's (`num_eval_samples=...`): one sampled path per row, its `eval/turn_{t}/...` metrics and
      `eval_logger`/`eval_aggregator` (`comlrl.evaluation`);
    - `train` takes CoMLRL's checkpoint arguments (`checkpoint_dir`, `checkpoint_interval`, `checkpoint_total_limit`)
      and needs `train_dataset` only here, as CoMLRL; `save_checkpoint` and `load_checkpoint` are CoMLRL's; the
      checkpoints are CoMLRL's, `checkpoint-{epochs}` with its metadata, on the Trainer's (`comlrl.checkpoints`),
      written by `_save_checkpoint` within `train(checkpoint_dir=...)`;
    - `_generate_and_score_completions` counts the joint actions scored in training (`env_step`);
    - CoMLRL's public attributes (`agents`, `tokenizer`, `optimizers`, `reference_models`, `env_step`, ...) are read
      from the trainer's state (docs/from_comlrl.md).
    - saving keeps CoMLRL's layout, `agent_{i}/` even for one agent (`one_agent_in_agent_folder`);
    - the objective is CoMLRL's where TRL's loss can express it: undiscounted returns (`discount` said once and
      unused, `comlrl.config.undiscounted`), weight decay on every parameter (`get_decay_parameter_names`), and the
      config's update defaults (docs/from_comlrl.md, "The objective").
    """

    names_other_faces = False  # a refused argument here gets the closest names (`keywords`)
    one_agent_in_agent_folder = True  # CoMLRL saves each agent into `agent_{i}/`, one agent too (`checkpoint`)
    # CoMLRL's class attributes: the config built when `args` is not given, and the algorithm's name (also TRL's
    # `_name`, which the model card shows); its REINFORCE family's subclasses set both (`trainers.reinforce`)
    default_config_cls = MAGRPOConfig
    algorithm_name = "MAGRPO"

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
        args = self.default_config_cls() if args is None else args
        if not isinstance(args, MAGRPOConfig):
            raise TypeError(
                f"{type(self).__name__} (CoMLRL face) needs `trl_multiagent.comlrl.MAGRPOConfig` (or a subclass) as "
                f"`args`, got {type(args).__module__}.{type(args).__name__}."
            )
        args = check_late_changes(args)  # a copy: the caller's config stays as it was
        say_early_termination(args)
        undiscounted(args)
        model, count = _team(agent_model, agents, num_agents)
        if agents is not None and isinstance(tokenizer, (list, tuple)) and len(tokenizer) != count:
            raise ValueError(
                f"{type(self).__name__}: tokenizers length must match agents (CoMLRL's words): {len(tokenizer)} "
                f"tokenizers for {count} agents."
            )
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
        # CoMLRL's checkpoints: the run's identity (`_checkpoint_metadata`) and, within
        # `train(checkpoint_dir=...)`, where they go and how many stay (`CheckpointDir`)
        self._run_id, self._checkpoint_dir = None, None
        self._env_steps, self._reward_calls = 0, [0]  # `env_step`, and the reward's completed calls
        callbacks = list(trl_arguments.pop("callbacks", None) or [])
        if wandb_config:
            callbacks += wandb_reporting(wandb_config, args)
        train_dataset, eval_dataset = _dataset(train_dataset), _dataset(eval_dataset)
        self._placeholder = None
        if train_dataset is None:  # CoMLRL needs it only to train; GRPOTrainer needs rows to be built
            train_dataset = self._placeholder = _placeholder_rows(args)
            args.check_functions_before_training = False  # no row of the user's to check them with
        elif isinstance(train_dataset, Dataset):
            fit_to_prompts(args, len(train_dataset))
        if eval_dataset is None:  # CoMLRL evaluates only with an eval_dataset
            args.eval_strategy, args.eval_on_start = "no", False
        formatter_list = [formatters] * count if callable(formatters) else formatters
        transition = external_transition
        if external_transition is not None:
            transition = comlrl_transition(external_transition, formatter_list, args.external_prompt_passthrough)
        super().__init__(
            model=model,
            reward_funcs=comlrl_reward(_counted(reward_func, self._reward_calls), count, reward_processor),
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
        # CoMLRL's public attributes that hold what was given (the others are properties, below)
        self.model_config = dict(model_config or {})
        self.wandb_config = wandb_config
        self.eval_logger, self.eval_aggregator = eval_logger, eval_aggregator
        self._given = {
            "reward_func": reward_func,
            "reward_processor": reward_processor if reward_processor is not None else _identity,
            "formatters": formatter_list,
            "external_transition": external_transition,
            "model_name": agent_model if isinstance(agent_model, str) else _model_name(self.agents[0]),
        }

    def train(
        self,
        resume_from_checkpoint=None,
        checkpoint_dir=None,
        checkpoint_interval=1,
        checkpoint_total_limit=None,
        trial=None,
        **kwargs,
    ):
        """The Trainer's `train` with CoMLRL's arguments and its rules for the dataset and checkpoints
        (`comlrl.checkpoints`).

        - `train_dataset` is needed here, not when the trainer is built; one set as `trainer.train_dataset = ...`
          after building (any sequence of rows) is used;
        - `checkpoint_dir`: a checkpoint after every `checkpoint_interval`-th epoch and after the last one, in
          `checkpoint_dir/checkpoint-{epochs completed}`, keeping this run's newest `checkpoint_total_limit`; without
          it no checkpoint is written;
        - `resume_from_checkpoint`: a checkpoint folder (or True: the newest complete one in `checkpoint_dir`, else
          `output_dir`), resumed at its step with its optimizer, scheduler and RNG states, as the Trainer resumes;
          `num_train_epochs` counts the whole run.
        """
        if (
            isinstance(checkpoint_interval, bool)
            or not isinstance(checkpoint_interval, int)
            or checkpoint_interval < 1
        ):
            raise ValueError(
                f"MAGRPOTrainer.train: checkpoint_interval must be a positive integer, got {checkpoint_interval!r}."
            )
        if checkpoint_total_limit is not None and (
            isinstance(checkpoint_total_limit, bool)
            or not isinstance(checkpoint_total_limit, int)
            or checkpoint_total_limit < 1
        ):
            raise ValueError(
                "MAGRPOTrainer.train: checkpoint_total_limit must be a positive integer or None, got "
                f"{checkpoint_total_limit!r}."
            )
        if self.train_dataset is self._placeholder:
            raise ValueError(
                "MAGRPOTrainer.train: no train_dataset. Pass train_dataset= to MAGRPOTrainer(...), or set "
                "trainer.train_dataset = ... (a Dataset or a list of dicts) before train()."
            )
        if not hasattr(self.train_dataset, "column_names"):
            self.train_dataset = _dataset(self.train_dataset)
        check_dataset_fills_a_step(self.train_dataset, self.args)
        resumed = None
        if resume_from_checkpoint not in (None, False):
            folder = str(checkpoint_dir if checkpoint_dir is not None else self.args.output_dir)
            resume_from_checkpoint = resolve_resume(folder, resume_from_checkpoint)
            resumed = metadata_of(Path(resume_from_checkpoint)) if resume_from_checkpoint else None
        if resume_from_checkpoint or checkpoint_dir is not None or checkpoint_interval != 1 or checkpoint_total_limit:
            # CoMLRL's run identity, made when train() gets checkpoint arguments: a resumed run keeps its
            # checkpoint's, so that it may replace its own later checkpoints
            self._run_id = resumed["run_id"] if resumed and resumed["run_id"] else uuid.uuid4().hex
        if checkpoint_dir is None:
            if checkpoint_interval != 1 or checkpoint_total_limit is not None:
                logger.warning(
                    "MAGRPOTrainer.train: checkpoint_interval/checkpoint_total_limit without checkpoint_dir: no "
                    "checkpoint is written (as in CoMLRL). Pass checkpoint_dir= to write them."
                )
            return super().train(resume_from_checkpoint=resume_from_checkpoint, trial=trial, **kwargs)
        root = Path(checkpoint_dir).expanduser().absolute()
        check_checkpoint_dir(root, resumed)
        every = EveryNthEpoch(checkpoint_interval)
        self._checkpoint_dir = CheckpointDir(root, checkpoint_total_limit)
        self.add_callback(every)
        try:
            return super().train(resume_from_checkpoint=resume_from_checkpoint, trial=trial, **kwargs)
        finally:
            self._checkpoint_dir = None
            self.remove_callback(every)

    def _save_checkpoint(self, model, trial) -> None:
        """Within `train(checkpoint_dir=...)`, CoMLRL's checkpoint: `checkpoint-{epochs completed}` (an existing one
        only if this run's), then `checkpoint_total_limit`'s pruning. Otherwise (TRL's `save_strategy`, given
        directly) the Trainer's own `checkpoint-{step}`."""
        if self._checkpoint_dir is None:
            return super()._save_checkpoint(model, trial)
        root, limit = self._checkpoint_dir
        target = root / f"{PREFIX_CHECKPOINT_DIR}-{completed_epochs(self.state)}"
        if target.exists() or target.is_symlink():
            check_own(target, self._run_id)
        self._write_checkpoint(target)
        if self.args.should_save:
            prune(root, target, limit, self._run_id)

    def save_checkpoint(self, output_dir) -> str:
        """CoMLRL's `save_checkpoint`: the trainer's state now, as a checkpoint `train(resume_from_checkpoint=...)`
        resumes from, `load_checkpoint` loads and `read_checkpoint_metadata` reads: each agent's `agent_{i}/`, the step
        and, once `train()` has made them, the optimizer, the scheduler and the RNG states; its `sequence` is the
        epochs completed. A folder there that is not a checkpoint is not replaced. Returns the folder."""
        target = Path(output_dir).expanduser().absolute()
        if target.is_symlink() or (target.exists() and not is_complete(str(target))):
            raise FileExistsError(f"MAGRPOTrainer.save_checkpoint: refusing to replace {target}: not a checkpoint.")
        return self._write_checkpoint(target)

    def _write_checkpoint(self, target: Path) -> str:
        """The Trainer's complete checkpoint (`write_complete_checkpoint`), written by every process into a staging
        folder beside `target` (the same name on each), with CoMLRL's metadata, then put at `target` whole."""
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = target.parent / f".{target.name}.staging"
        if self.args.should_save and staging.exists():
            shutil.rmtree(staging)  # left by a save that was stopped
        self.accelerator.wait_for_everyone()
        # before `train()` there is no optimizer, scheduler or RNG state to save: the weights and the step only
        save_only_model = self.args.save_only_model or self.optimizer is None
        try:
            written = self.write_complete_checkpoint(
                self.model, None, output_dir=str(staging), save_only_model=save_only_model
            )
            if self.args.should_save:
                write_metadata(Path(written), self._checkpoint_metadata())
                replace_folder(Path(written), target)
            self.accelerator.wait_for_everyone()
        finally:
            if self.args.should_save:
                shutil.rmtree(staging, ignore_errors=True)
        return str(target)

    def _checkpoint_metadata(self) -> dict[str, Any]:
        """CoMLRL's checkpoint metadata (`read_checkpoint_metadata`): this class, the epochs completed, the run's
        identity (None until `train()` got checkpoint arguments or `load_checkpoint` read one, as in CoMLRL) and,
        when the run reports to W&B, its W&B run."""
        reports_to_wandb = "wandb" in (self.args.report_to or [])
        return {
            "version": CHECKPOINT_VERSION,
            "trainer_class": f"{type(self).__module__}.{type(self).__qualname__}",
            "sequence": completed_epochs(self.state),
            "run_id": self._run_id,
            "wandb": wandb_identity() if reports_to_wandb else None,
        }

    def load_checkpoint(self, checkpoint) -> dict:
        """CoMLRL's `load_checkpoint`: each agent's weights from a checkpoint (of `save_checkpoint` or of training)
        into this trainer, now. The optimizer, the scheduler, the RNG states and the step are the Trainer's to restore
        when training starts: `train(resume_from_checkpoint=checkpoint)` does (a plain `train()` starts at step 0 with
        these weights and a new optimizer). Returns where the checkpoint was: `{"epoch", "global_step"}`."""
        folder = Path(checkpoint).expanduser()
        if not is_complete(str(folder)):
            raise FileNotFoundError(
                f"MAGRPOTrainer.load_checkpoint: {folder} is not a complete checkpoint (no {COMPLETE_MARKER})."
            )
        self._load_from_checkpoint(str(folder))
        metadata = metadata_of(folder)
        if metadata is not None:
            self._run_id = metadata["run_id"]  # saving again continues its run, as in CoMLRL
        state = TrainerState.load_from_json(str(folder / TRAINER_STATE_NAME))
        logger.warning(
            f"MAGRPOTrainer.load_checkpoint: the agents' weights of {folder} are loaded; "
            f"train(resume_from_checkpoint={str(folder)!r}) also restores its optimizer, scheduler, RNG states and step "
            f"({state.global_step})."
        )
        return {"epoch": state.epoch, "global_step": state.global_step}

    def evaluate(self, num_eval_samples: int | None = None, ignore_keys=None) -> dict[str, Any]:
        """CoMLRL's `evaluate` (`comlrl.evaluation`): the first `num_eval_samples` rows of `eval_dataset` (default
        `args.eval_num_samples`; CoMLRL evaluates at least one), one sampled path each, every turn run, in batches of
        `eval_batch_size` prompts. Returns CoMLRL's metrics, `eval/turn_{t}/reward_mean`, `eval/turn_{t}/expected_return`
        and `eval/{key}` of `eval_aggregator`; `{}` without an `eval_dataset`. They are logged as the Trainer logs an
        evaluation (`eval_turn_1/reward_mean`, which wandb's callback writes as CoMLRL's `eval/turn_1/reward_mean`).

        The Trainer calls it on `eval_strategy`'s schedule (`eval_interval`), with `ignore_keys` (model outputs to
        leave out of its predictions: this evaluation makes none, so only None is taken)."""
        if ignore_keys is not None:
            raise ValueError(
                f"MAGRPOTrainer.evaluate: ignore_keys={ignore_keys!r}: CoMLRL's evaluation keeps no model outputs to "
                "ignore (train(ignore_keys_for_eval=...) reaches it here). Leave it None."
            )
        count = self.args.eval_num_samples if num_eval_samples is None else num_eval_samples
        try:
            count = int(count)  # as CoMLRL reads it
        except (TypeError, ValueError):
            raise TypeError(f"MAGRPOTrainer.evaluate: num_eval_samples must be an integer, got {count!r}.") from None
        if self.eval_dataset is None:
            return {}
        rows = [dict(self.eval_dataset[i]) for i in range(min(max(count, 1), len(self.eval_dataset)))]
        if not rows:
            return {}
        paths = self._evaluated_paths(rows)
        metrics = self._evaluation.metrics(paths, self.args.num_turns) if self._evaluation is not None else {}
        metrics.update(turn_metrics(paths.rewards, self.args.num_turns))
        training = self.model.training
        self.model.eval()  # GRPOTrainer's `log` reads its mode: eval adds no training values to this line
        try:
            self.log(trainer_log_keys(metrics))
        finally:
            self.model.train(training)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics

    def _evaluated_paths(self, rows: list[dict]) -> EvaluatedPaths:
        """One path per row, `eval_batch_size` rows per rollout, in eval mode with every turn run (CoMLRL's evaluation
        has no early termination). Environments made here are closed after an `evaluate` called on its own."""
        batch = max(int(self.args.comlrl_batch_sizes["eval_batch_size"]), 1)
        training = self.model.training
        paths = EvaluatedPaths(self.num_agents)
        self.model.eval()
        try:
            with torch.no_grad():
                for start in range(0, len(rows), batch):
                    tree = self.rollout(rows[start : start + batch], 1, every_turn=True)
                    paths.add(tree, rows[start : start + batch])
        finally:
            self.model.train(training)
            if not self.is_in_train:
                close_environments(self.task)
        return paths

    # CoMLRL's public attributes, read from the core's state (docs/from_comlrl.md says what each one is here).
    @FixedWhenBuilt
    def agents(self) -> list:
        """Each agent's model, in order (a PEFT model for an adapter agent; on a shared base, the one model)."""
        return [self.team.agent(i) for i in range(self.team.num_agents)]

    @FixedWhenBuilt
    def tokenizer(self):
        """The first agent's tokenizer (`tokenizers` has one per agent)."""
        return self.tokenizers[0]

    @FixedWhenBuilt
    def optimizers(self) -> list:
        """The optimizer, once `train()` has made it: one for the team (the Trainer's), with each agent's parameters
        in it; CoMLRL keeps one per agent. Empty before training."""
        return [self.optimizer] if self.optimizer is not None else []

    @FixedWhenBuilt
    def reference_models(self) -> list:
        """Each agent's frozen reference copy, with `reference_kl_enabled` (`beta > 0`); empty without it, as in
        CoMLRL. On a shared base the references are adapters of the one model: refused, with what to read instead."""
        if self.ref_team is not None:
            return [self.ref_team.agent(i) for i in range(self.ref_team.num_agents)]
        if self.beta and self.team.is_shared_base:
            raise AttributeError(
                "MAGRPOTrainer.reference_models: on a shared base each agent's reference is an adapter of the one "
                "model (trainer.team, with `team.reference(i)`), not a model of its own."
            )
        return []

    @FixedWhenBuilt
    def agent_devices(self) -> list:
        """Each agent's device: every agent is on this process's device here (each process holds the whole team)."""
        return [self.accelerator.device] * self.team.num_agents

    @FixedWhenBuilt
    def env_step(self) -> int:
        """Joint actions scored in training so far (CoMLRL's counter of environment steps)."""
        return self._env_steps

    reward_func = FixedWhenBuilt(lambda self: self._given["reward_func"], doc="The reward function, as given.")
    reward_processor = FixedWhenBuilt(
        lambda self: self._given["reward_processor"], doc="The reward processor, as given (identity if none)."
    )
    formatters = FixedWhenBuilt(
        lambda self: self._given["formatters"], doc="One formatter per agent, or None, as given."
    )
    external_transition = FixedWhenBuilt(
        lambda self: self._given["external_transition"], doc="The transition, as given."
    )
    model_name = FixedWhenBuilt(
        lambda self: self._given["model_name"], doc="`agent_model`, or the first agent's name or path."
    )

    def get_decay_parameter_names(self, model) -> list[str]:
        """Every parameter takes AdamW's weight decay, as in CoMLRL, which gives `torch.optim.AdamW` all of an agent's
        parameters in one group (the Trainer exempts biases and norms)."""
        return [name for name, _ in model.named_parameters()]

    def _generate_and_score_completions(self, inputs):
        """The core's, counting the joint actions scored in training (`env_step`: the reward is called once per joint
        action; evaluation's calls are not counted, as in CoMLRL)."""
        before = self._reward_calls[0]
        output = super()._generate_and_score_completions(inputs)
        if self.model.training:
            self._env_steps += self._reward_calls[0] - before
        return output

    def _prepare_arguments(self, args, **given):
        inputs = super()._prepare_arguments(args, **given)
        if self._special_tokens:
            add_special_tokens(inputs.tokenizers, self._special_tokens)
            inputs.grows_embeddings = True  # each agent's embeddings grow to its tokenizer
        return inputs


def _team(agent_model, agents, num_agents: int) -> tuple[Any, int]:
    """CoMLRL's team: `agents` (one per agent), or `agent_model` (an id) copied `num_agents` times; the TRL face's
    `model=` for it, and the team's size."""
    if agent_model is None and agents is None:
        raise ValueError("MAGRPOTrainer: Either agent_model or agents must be provided (CoMLRL's words).")
    if agents is not None:
        if agent_model is not None:
            if len(agents) != num_agents:  # with both, CoMLRL counts the team by `num_agents`
                raise ValueError(
                    f"MAGRPOTrainer: agents length ({len(agents)}) must match num_agents ({num_agents}) (CoMLRL's "
                    "words)."
                )
            check_agent_model_names(agent_model, agents)  # CoMLRL accepts both when they name the same model
        return list(agents), len(agents)
    if not isinstance(agent_model, str):
        raise ValueError(
            f"MAGRPOTrainer: agent_model should be a string (a model id or folder) to create homogeneous agents, got "
            f"{type(agent_model).__name__}; pass models in memory as agents=[...]."
        )
    return agent_model, num_agents


class CheckpointDir(NamedTuple):
    """Within `train(checkpoint_dir=...)`: where CoMLRL's checkpoints go, and `checkpoint_total_limit` (None: all stay)."""

    root: Path
    limit: int | None


class EveryNthEpoch(TrainerCallback):
    """CoMLRL's `checkpoint_interval`, within `train(checkpoint_dir=...)`: a checkpoint after every `interval`-th epoch
    and after the last, none between epochs, whatever the config's `save_strategy` says (added after the Trainer's
    `DefaultFlowCallback`, this callback has the last word on `should_save`)."""

    def __init__(self, interval: int):
        self.interval = interval

    def on_step_end(self, args, state, control, **kwargs):
        control.should_save = False

    def on_epoch_end(self, args, state, control, **kwargs):
        control.should_save = not (round(state.epoch) % self.interval and state.global_step < state.max_steps)


PLACEHOLDER_PROMPT = "(no train_dataset given: MAGRPOTrainer.train() refuses to run on this row)"


def _placeholder_rows(args) -> Dataset:
    """One generation's worth of rows to build GRPOTrainer with when no `train_dataset` is given (CoMLRL needs one
    only to train); `train()` refuses to run on them."""
    return Dataset.from_dict({"prompt": [PLACEHOLDER_PROMPT] * (args.generation_batch_size // args.num_generations)})


def _identity(reward: float) -> float:
    return reward


def _counted(func: Callable, calls: list[int]) -> Callable:
    """`func`, counting its completed calls in `calls[0]` (its signature is read through `__wrapped__`)."""

    @functools.wraps(func)
    def counted(*args, **kwargs):
        result = func(*args, **kwargs)
        calls[0] += 1
        return result

    return counted


def _model_name(model) -> str:
    """CoMLRL's name for a model given in memory: its config's `_name_or_path`, else its `model_type`, else its
    class's name (a PEFT model's base model's)."""
    base = getattr(model, "base_model", model) if hasattr(model, "peft_config") else model
    config = getattr(base, "config", None)
    return getattr(config, "_name_or_path", None) or getattr(config, "model_type", None) or type(base).__name__


def _dataset(dataset):
    """A dataset as the core takes it: CoMLRL iterates any sequence of rows, such as a list of dicts."""
    if dataset is None or hasattr(dataset, "column_names"):
        return dataset
    return Dataset.from_list([dict(row) for row in dataset])
