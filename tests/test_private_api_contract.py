"""The private APIs of TRL, transformers, accelerate, PEFT, vLLM and torch that `trl_multiagent/` relies on, each under a
contract test. A release that removes one, renames it, or changes the behaviour listed here must fail in this module,
naming the API and the installed version, rather than let the package train wrongly. The supported ranges are pinned in
pyproject.toml.

Every test is decorated with `contract(library, *names, used_in=...)`: whatever fails inside it (an assertion, a
missing attribute, a changed signature) is raised again as `ContractBroken`, whose message names the library and its
version, the API and where the package uses it. `test_every_private_name_the_package_uses_is_listed` keeps this list
complete: a private name the package starts to use, which one of these libraries defines, must be added below (and
get a test). `test_a_removed_api_fails_its_contract_naming_it` shows a removed API failing its contract.

The tests marked `vllm` need vLLM (the vLLM environment, `tests/vllm_suite.sh`): `python -m pytest -m vllm
tests/test_private_api_contract.py` there. They build one CPU engine.

What is relied on, by library (API -- where in `trl_multiagent/` -- the behaviour relied on, which the test checks):

TRL (`trl.trainer.grpo_trainer.GRPOTrainer`, which `MAGRPOTrainer` subclasses, and `trl.models.utils`,
`trl.trainer.utils`)

- `GRPOTrainer._metrics` -- trainer.py (`_log_metrics`, `_log_rollout_metrics`) -- `{"train": defaultdict(list),
  "eval": defaultdict(list)}`; `log` averages the values appended to `_metrics[mode][key]` (a key may also be set to a
  one-element list), logs them (`eval_` prefixed in eval) and clears the mode's dict.
- `GRPOTrainer._logs` -- trainer.py, metrics.py (`completion_logs`) -- the layout the completions table is read from:
  deques `images`, `prompt`, `completion`, `advantages`, and dicts of deques `rewards` and `extra` (by column);
  `log` (with `log_completions`) writes `completions/completions_{step:05d}.parquet` with the columns `step`,
  `prompt`, `completion`, the rewards, the extra columns and `advantage`.
- `GRPOTrainer._step` -- trainer.py (`_prepare_inputs`, `training_step`) -- counts micro-steps: 0 after `__init__`,
  incremented by `GRPOTrainer.training_step` after each `Trainer.training_step`.
- `GRPOTrainer._buffered_inputs` -- trainer.py (`_prepare_inputs`) -- None after `__init__` (so a resumed run
  generates first), and read or written by no GRPOTrainer method but `_prepare_inputs`, which the package replaces.
- `GRPOTrainer._compute_loss` -- trainer.py (`_team_loss`, once per agent and chunk, inside `_loss_call`),
  update/batching.py, update/chunking.py, update/importance.py, update/loss_call.py -- signature `(self, model,
  inputs)`; reads the keys `tree_rows` builds; masks with `completion_mask * tool_mask`; normalises each `loss_type` as
  `chunking.chunk_weight` assumes; multiplies the per-token loss by `inputs["importance_sampling_ratio"]` when
  `use_vllm` and `vllm_importance_sampling_correction`; runs the policy's forward once, through
  `self._get_per_token_logps_and_entropies(..., compute_entropy=True)`, and reads the ratio only after it.
- `GRPOTrainer._entropy_bonus_enabled` -- update/entropy.py (`TeamEntropyBonus`, set False: the package adds each
  agent's bonus itself) -- set by `GRPOTrainer.__init__` (True with `entropy_coef` or `use_adaptive_entropy`);
  `_compute_loss` subtracts `entropy_coef` times the mean entropy of the call's tokens only while it is True.
- `GRPOTrainer._get_per_token_logps_and_entropies` -- trainer.py (overridden; the stock one is called positionally
  with `batch_size, compute_entropy, compute_aux_loss`), update/prefix.py (`chunked_per_token_logps`) -- signature;
  returns `(log_probs, entropies, aux_loss)`, the log-probs being those of the completion tokens at temperature
  `temperature`.
- `GRPOTrainer._get_tool_suffix_ids` -- rollout/tools.py (`ToolCalling.suffix_ids`, called on a stand-in) -- signature
  `(self, tool_messages)`; reads only `processing_class`, `_tokenizer`, `chat_template`, `chat_template_kwargs`,
  `_is_vlm`; returns the tokens that append a tool message to an assistant turn.
- `GRPOTrainer._generate_and_score_completions` -- trainer.py (overridden, returns `{"agents": [...]}`) -- signature
  `(self, inputs)`; called by no GRPOTrainer or Trainer method but `_prepare_inputs` (which the package replaces), so
  nothing of TRL's reads the different output.
- `GRPOTrainer._prepare_inputs` -- trainer.py (overridden: one micro-batch holds every agent) -- signature
  `(self, generation_batch)`; `Trainer.training_step` calls it once per micro-step and hands its result to
  `compute_loss` as it is (`GRPOTrainer.prediction_step` likewise).
- `GRPOTrainer._get_train_sampler` -- checkpoint.py (wrapped in update/batching.py's `EpochSeededSampler`) -- signature
  `(self, dataset)`; returns TRL's `RepeatSampler`, whose `shuffle`, `seed` and `generator` the wrapper reads, and
  whose order is drawn from `generator` alone (seeding it fixes the order).
- `GRPOTrainer._env_tools`, `GRPOTrainer._environment_pool` -- trainer.py (set with the same meaning, for TRL's tests
  and scripts that read them), rollout/tools.py (`ToolCalling.environment_tools`) -- set by `GRPOTrainer.__init__`
  with `environment_factory`: `_environment_pool` is `{name: [instances]}` (the name None for a single factory),
  holding the probe alone after `__init__`; `_env_tools` is `{name: tools=, then the probe's public methods but
  reset and get_reward, bound to it}`.
- `GRPOTrainer` instance attributes (`accelerator`, `beta`, `chat_template_kwargs`, `generation_kwargs`,
  `is_deepspeed_enabled`, `log_completions`, `loss_type`, `mask_truncated_completions`, `max_completion_length`,
  `model_wrapped`, `num_generations`, `num_generations_eval`, `num_iterations`, `reward_funcs`,
  `reward_processing_classes`, `scale_rewards`, `temperature`, `use_vllm`, `vllm_importance_sampling_correction`) --
  trainer.py -- set by `GRPOTrainer.__init__`.
- `add_fused_lm_head` and the `forward` it sets (`trl.trainer.utils`) -- trainer.py (`del self.team.forward`, then
  `add_fused_lm_head` on each agent), update/prefix.py -- `GRPOTrainer.__init__` patches the model it is given (the
  team) by setting a `forward` instance attribute, which `del` removes, giving back the class's `forward`; on an agent,
  `forward(..., labels=..., fused_lm_head=True)` returns `log_probs` and `entropy` per token; the patch wraps the
  original forward in a closure, so a deep copy (the reference agents) drops it and is patched again
  (team/assembly.py, `add_fused_heads`).
- `_unwrap_model_for_generation` (`trl.models.utils`) -- generation/hf.py -- signature `(model, accelerator,
  gather_deepspeed3_params, ...)` (1.16 adds `gradient_checkpointing_kwargs`, which the package does not pass: it
  turns checkpointing off itself with `disable_gradient_checkpointing`, since 1.15 turns it back on without the
  kwargs); outside ZeRO-3 it yields the unwrapped model (the team), and leaves a team without checkpointing as it is.
- `disable_gradient_checkpointing`, `add_hooks`, `remove_hooks`, `prepare_deepspeed`, `pad`, `ensure_master_addr_port`
  (undocumented helpers of `trl.models.utils` and `trl.trainer.utils`) -- trainer.py, generation/hf.py,
  team/assembly.py, update/batching.py, generation/vllm_settings.py -- signatures.
- `GRPOConfig.__post_init__`'s refusal of `num_generations < 2` -- comlrl/trainers/actor_critic/config.py
  (`ActorCriticConfig._grpo_post_init` catches it for `num_generations=1`) -- a `ValueError` opening with
  `ONE_GENERATION_REFUSAL`, after which `__post_init__` reads only `vllm_importance_sampling_*` fields (the checks the
  catch skips, which do not apply: the actor-critic configs refuse vLLM).

- `GRPOTrainer.__init__`, the config it reads -- arguments/grpo.py (`grpo_trainer_settings`, around it in trainer.py)
  -- `beta` (0.0: no reference model, `self.ref_model = None`), `use_vllm` (False: no vLLM engine, and
  `self.generation_kwargs` filled for the transformers backend), `model_init_kwargs` (None: no warning that it is
  ignored), `cast_lm_head_to_fp32` (False: no cast of the container's `lm_head`), `sync_ref_model` (False: no sync
  callback, and no error with beta 0), `reward_weights` (one per reward function, made into `self.reward_weights`),
  each read from `args` while `__init__` runs (after it, the trainer reads the configured values).

transformers

- `Trainer.current_gradient_accumulation_steps` -- trainer.py (`training_step`) -- set by the training loop before
  each micro-step, to the number of micro-batches of the current accumulation window.
- `Trainer._get_output_dir` -- checkpoint.py (`_save_checkpoint`) -- signature `(self, trial)`;
  without a trial, the run's `output_dir`, in which `Trainer._save_checkpoint` writes `checkpoint-{step}`.
- `Trainer._load_optimizer_and_scheduler`, `Trainer._save_optimizer_and_scheduler` -- update/entropy.py,
  comlrl/trainers/actor_critic/trainer.py (overridden: the entropy coefficients and the critics' AdamW states are
  kept beside the optimizer, as GRPOTrainer keeps its adaptive entropy coefficient) -- signatures `(self, checkpoint)`
  and `(self, output_dir)`; the training loop calls the first with the checkpoint it resumes from, under DeepSpeed
  too; `_save_checkpoint` calls the second with the checkpoint's folder.
- `Trainer._remove_unused_columns` -- trainer.py (overridden: every column is kept for the environments)
  -- signature `(self, dataset, description)`; where Trainer drops dataset columns (its dataloaders call it);
  GRPOTrainer does not override it.
- `Trainer._save`, `Trainer._save_checkpoint`, `Trainer._load_from_checkpoint` (overridden), `rotate_checkpoints`
  -- checkpoint.py, comlrl/trainer.py (`_write_checkpoint`) -- signatures;
  `_save_checkpoint` reads `output_dir` (through `_get_output_dir`), `save_only_model` and `save_total_limit` from
  `self.args` when called, writes `checkpoint-{step}` there, and rotates last, with `rotate_checkpoints(...,
  save_total_limit=self.args.save_total_limit)`, a function, not a method to override: the package binds `self.args`
  to a copy without the limit for that one call (`checkpoint.args_for_one_call`), then rotates after the completion
  marker with the configured limit; the config itself is never changed.
- `GradientCheckpointingLayer._can_checkpoint_with_cache` -- update/prefix.py (`_cache_through_checkpointing`) -- a
  class attribute, False; with the instance attribute set to True, a checkpointed layer keeps its cache argument
  (training, gradients on), so the prefix's keys and values reach attention; `del` gives back the class's False.
- `GradientCheckpointingLayer._gradient_checkpointing_func` and its `.keywords` -- update/prefix.py
  (`uses_reentrant_checkpointing`) -- after checkpointing is enabled with `{"use_reentrant": ...}`, each checkpointed
  layer holds a `functools.partial` whose `keywords["use_reentrant"]` is that value.
- `PreTrainedModel.should_save_on_this_rank` -- checkpoint.py (`written_by_caller`) -- signature
  `(self, is_main_process)`; `save_pretrained` asks it (an instance attribute overrides it) whether this process
  writes the weights.
- `PreTrainedModel._tied_weights_keys` / `all_tied_weights_keys` -- checkpoint.py (`load_agent_weights`) -- the keys
  `save_pretrained` leaves out of a tied model's file are among them.
- `PretrainedConfig._name_or_path` -- team/assembly.py, rewards/models.py, comlrl/trainer.py, comlrl/arguments.py -- after
  `from_pretrained(folder)`, the folder (or hub id) the model was loaded from.

accelerate

- `GradientState._set_sync_gradients` -- distributed.py (`deferred_gradient_reduction`) -- `_set_sync_gradients(False)`
  makes `sync_gradients` (and `Accelerator.sync_gradients`) False; `Accelerator.backward` passes it to DeepSpeed's
  wrapper as `sync_gradients`, which then neither reduces nor steps.

PEFT

- `BaseTunerLayer._active_adapter` -- team/agent_team.py (`_activate`) -- holds the active adapter name(s) (`[name]`
  after `set_adapter(name)`); assigning `[name]` routes the layer through adapter `name`, as `set_adapter` does, but
  changes no `requires_grad` (every agent's adapter stays trainable). With it the package sets the tuner's plain
  `active_adapter` attribute, which `PeftModel.active_adapters` reads.
- `AuxiliaryTrainingWrapper._active_adapter` (`peft.utils.other`) -- team/agent_team.py (`_point_adapters`, `reference`)
  -- a `modules_to_save` wrapper holds its active adapter's name (a string, after `set_adapter`); assigning another
  name routes the module through that adapter's copy (`modules_to_save[name]`, as `add_adapter` makes it), its
  `weight` included, and changes no `requires_grad`: the frozen "ref" copy of an adapter runs without training it.

vLLM (tests marked `vllm`; one in-process engine, `VLLM_ENABLE_V1_MULTIPROCESSING=0`, as the colocate backend builds it)

- `LLMEngine.engine_core._finalizer` -- generation/vllm_colocate.py (`shut_down`) -- a `weakref.finalize` that shuts the
  engine core down, once: afterwards it is dead, and calling it again does nothing.
- `LLMEngine.model_executor.driver_worker.model_runner.model` -- generation/vllm_colocate.py (`engine_model`) -- the
  torch model in this process; its `load_weights` takes transformers' parameter names and writes those weights.
- `LLMEngine.model_config.max_model_len`, `LLMEngine.remove_lora` -- generation/vllm_colocate.py (`_sample`,
  `_push_adapter`) -- the engine's context length; `remove_lora(lora_id)`.
- `vllm.model_executor.layers.utils.dispatch_cpu_unquantized_gemm` and the `cpu_linear` it sets (vLLM on CPU) --
  generation/vllm_cpu.py -- signature `(layer, remove_weight)`; a packed layer carries `cpu_linear`; with
  `keep_linear_weights` the layers keep their weights, and after `load_weights` and `repack` the engine generates
  greedily as transformers does with the same weights.

torch

- `_checkpoint_wrapped_module` (`torch.distributed.algorithms._checkpoint.checkpoint_wrapper`) --
  generation/vllm_colocate.py (`_push_full_weights`) -- a module wrapped for activation checkpointing (FSDP's) names
  its parameters `..._checkpoint_wrapped_module.<name>`; removing that part gives transformers' names.

Not tested: `_model_name_or_path` (demo/models.py) is a key the GGUF loader may put in a config; the package deletes
it when present, and does nothing when it is not. `_keeps_weights` (generation/vllm_cpu.py) is the package's own
mark on its own function.
"""

import contextlib
import copy
import functools
import importlib
import inspect
import os
import pathlib
import re
import types
import weakref
from collections import deque

import pytest
import torch
import transformers
import trl
from datasets import Dataset
from packaging.version import Version
from transformers import Trainer
from transformers.trainer_utils import rotate_checkpoints
from trl import GRPOConfig, GRPOTrainer
from trl.models.utils import (
    _unwrap_model_for_generation,
    add_hooks,
    disable_gradient_checkpointing,
    prepare_deepspeed,
    remove_hooks,
)
from trl.trainer.utils import add_fused_lm_head, ensure_master_addr_port, pad

from trl_multiagent.demo.testing import make_model, make_tokenizer


PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "trl_multiagent"


class ContractBroken(AssertionError):
    """A private API the package relies on is gone, or no longer behaves as relied on."""


def installed_version(library: str) -> str:
    try:
        return str(importlib.import_module(library).__version__)
    except Exception:  # the message is still useful without the version
        return "(version unknown)"


def contract(library: str, *names: str, used_in: str):
    """Mark a test as the contract of `names`, private APIs of `library` that `trl_multiagent/{used_in}` relies on.

    Any failure of the test is raised again as `ContractBroken`, naming the library, its installed version, the APIs
    and where the package uses them; the module docstring says what is relied on.
    """

    def decorate(test):
        @functools.wraps(test)
        def checked(*args, **kwargs):
            try:
                return test(*args, **kwargs)
            except Exception as error:
                apis = ", ".join(f"`{name}`" for name in names)
                raise ContractBroken(
                    f"{library} {installed_version(library)}: the private API {apis}, which trl_multiagent relies on "
                    f"(in {used_in}), is gone or behaves differently: {type(error).__name__}: {error}. See the "
                    "docstring of tests/test_private_api_contract.py for what the package relies on; adapt the "
                    f"package to this {library} release, or install a tested one (pyproject.toml)."
                ) from error

        checked.contract, checked.used_in = (library, names), used_in
        return checked

    return decorate


def params(func):
    return list(inspect.signature(func).parameters)


def methods_using(cls, name: str) -> list[str]:
    """The methods defined in `cls` itself whose code (comments left out) reads or writes `self.{name}`."""
    found = []
    for attribute, value in vars(cls).items():
        function = getattr(value, "__wrapped__", value)  # TRL's `profiling_decorator`
        if not inspect.isfunction(function):
            continue
        code = re.sub(r"#.*", "", inspect.getsource(function))
        if re.search(rf"\bself\.{name}\b", code):
            found.append(attribute)
    return sorted(found)


def enable_checkpointing(model, **kwargs) -> None:
    """Activation checkpointing by transformers' current name, or the legacy one (before 5.20), as AgentTeam does."""
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def checkpointed_layers(model) -> list:
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]


def length_reward(completions, **kwargs):
    return [float(len(c)) for c in completions]


PROMPTS = ["a b", "c d", "e f", "g h", "one two", "three four", "five six", "seven eight"]


def grpo_trainer(tmp_path, trainer_class=GRPOTrainer, **overrides):
    """A stock GRPOTrainer on a tiny model (about 0.3 s)."""
    tokenizer = make_tokenizer()
    values = dict(
        output_dir=str(tmp_path), num_generations=2, per_device_train_batch_size=2, max_completion_length=4,
        max_steps=1, report_to="none", use_cpu=True, bf16=False, logging_steps=1, save_strategy="no",
        disable_tqdm=True, seed=0,
    )  # fmt: skip
    values.update(overrides)
    return trainer_class(
        model=make_model(tokenizer), reward_funcs=length_reward, args=GRPOConfig(**values),
        train_dataset=Dataset.from_dict({"prompt": PROMPTS}), processing_class=tokenizer,
    )  # fmt: skip


class RecordingTrainer(GRPOTrainer):
    """GRPOTrainer, recording what MAGRPOTrainer's overrides read: `_step`, `current_gradient_accumulation_steps`,
    and the path of `_prepare_inputs`' result to `compute_loss`."""

    def __init__(self, *args, **kwargs):
        self.steps, self.prepared, self.loss_inputs = [], [], []
        super().__init__(*args, **kwargs)

    def training_step(self, model, inputs, num_items_in_batch):
        # getattr: a missing attribute fails the test of its contract, not this fixture
        before = (getattr(self, "_step", None), getattr(self, "current_gradient_accumulation_steps", None))
        loss = super().training_step(model, inputs, num_items_in_batch)
        self.steps.append((*before, getattr(self, "_step", None)))
        return loss

    def _prepare_inputs(self, generation_batch):
        prepared = super()._prepare_inputs(generation_batch)
        self.prepared.append(prepared)
        return prepared

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        self.loss_inputs.append(inputs)
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One optimizer step of two micro-steps (gradient_accumulation_steps=2), both from one generation."""
    trainer = grpo_trainer(
        tmp_path_factory.mktemp("recorded"), RecordingTrainer, gradient_accumulation_steps=2, steps_per_generation=2
    )
    trainer.train()
    return trainer


# ====================================================================== versions


def test_versions_in_tested_range():
    assert Version("1.15") <= Version(trl.__version__) < Version("1.17"), trl.__version__
    assert Version(transformers.__version__).major == 5, transformers.__version__


# ====================================================================== TRL


@contract("trl", "GRPOTrainer._metrics", used_in="trainer.py")
def test_metrics_appended_per_mode_are_averaged_by_log(tmp_path):
    trainer = grpo_trainer(tmp_path)
    assert set(trainer._metrics) == {"train", "eval"}
    for mode in ("train", "eval"):
        assert trainer._metrics[mode] == {} and trainer._metrics[mode].default_factory is list
        trainer.model.train(mode == "train")
        trainer._metrics[mode]["contract/value"].append(1.0)
        trainer._metrics[mode]["contract/value"].append(3.0)
        trainer._metrics[mode]["contract/set"] = [5.0]
        trainer.log({})
        prefix = "" if mode == "train" else "eval_"
        logged = trainer.state.log_history[-1]
        assert logged[f"{prefix}contract/value"] == 2.0 and logged[f"{prefix}contract/set"] == 5.0, logged
        assert trainer._metrics[mode] == {}, "log did not clear the metrics it logged"


@contract("trl", "GRPOTrainer._logs", used_in="trainer.py, metrics.py")
def test_logs_layout_is_the_completions_table(tmp_path):
    import pandas as pd

    from trl_multiagent.metrics import completion_logs

    trainer = grpo_trainer(tmp_path, log_completions=True)
    assert set(trainer._logs) == set(completion_logs([])), sorted(trainer._logs)
    assert all(isinstance(trainer._logs[key], deque) for key in ("images", "prompt", "completion", "advantages"))
    assert all(isinstance(trainer._logs[key], dict) for key in ("rewards", "extra"))  # columns by name
    rows = [
        {"agent": i, "turn": 1, "prompt": f"p{i}", "completion": f"c{i}", "advantage": 0.5 * i, "rewards": {"r": 1.0}}
        for i in range(2)
    ]
    trainer._logs = completion_logs(rows)
    trainer.log({})
    table = pd.read_parquet(
        os.path.join(tmp_path, "completions", f"completions_{trainer.state.global_step:05d}.parquet")
    )
    assert list(table.columns) == ["step", "prompt", "completion", "r", "agent", "turn", "advantage"], table.columns
    assert table["completion"].tolist() == ["c0", "c1"] and table["advantage"].tolist() == [0.0, 0.5]


@contract("trl", "GRPOTrainer._step", used_in="trainer.py")
def test_step_counts_micro_steps(trained):
    # (_step before, current_gradient_accumulation_steps, _step after) at each micro-step
    assert [(before, after) for before, _, after in trained.steps] == [(0, 1), (1, 2)], trained.steps
    assert trained._step == 2


@contract("trl", "GRPOTrainer._buffered_inputs", used_in="trainer.py")
def test_buffered_inputs_start_empty_and_belong_to_prepare_inputs(tmp_path):
    assert grpo_trainer(tmp_path)._buffered_inputs is None
    assert methods_using(GRPOTrainer, "_buffered_inputs") == ["__init__", "_prepare_inputs"]
    assert methods_using(Trainer, "_buffered_inputs") == []


@contract("trl", "GRPOTrainer._generate_and_score_completions", used_in="trainer.py")
def test_generate_and_score_completions_is_read_by_prepare_inputs_alone():
    assert params(GRPOTrainer._generate_and_score_completions) == ["self", "inputs"]
    assert methods_using(GRPOTrainer, "_generate_and_score_completions") == ["_prepare_inputs"]
    assert methods_using(Trainer, "_generate_and_score_completions") == []


@contract("trl", "GRPOTrainer._prepare_inputs", used_in="trainer.py")
def test_prepare_inputs_result_goes_to_compute_loss_as_it_is(trained):
    assert params(GRPOTrainer._prepare_inputs) == ["self", "generation_batch"]
    assert len(trained.prepared) == 2, "one _prepare_inputs call per micro-step"
    assert all(a is b for a, b in zip(trained.prepared, trained.loss_inputs, strict=True))
    assert "self._prepare_inputs(inputs)" in inspect.getsource(GRPOTrainer.prediction_step)


def two_on_policy_rows() -> dict:
    """Two rows of 4 completion tokens, advantages 1 and 0.5, no old log-probs: on-policy, every ratio exactly 1."""
    return {
        "prompt_ids": torch.tensor([[5, 6, 7], [8, 9, 10]]),
        "prompt_mask": torch.ones(2, 3, dtype=torch.long),
        "completion_ids": torch.tensor([[11, 12, 13, 14], [15, 16, 17, 18]]),
        "completion_mask": torch.ones(2, 4, dtype=torch.long),
        "advantages": torch.tensor([1.0, 0.5]),
        "num_items_in_batch": torch.tensor(8.0),
    }


@contract("trl", "GRPOTrainer._entropy_bonus_enabled", used_in="update/entropy.py")
def test_entropy_bonus_is_added_only_while_enabled(tmp_path):
    trainer = grpo_trainer(tmp_path, loss_type="dapo", entropy_coef=0.5)
    trainer.model.eval()  # no accumulation normaliser
    assert trainer._entropy_bonus_enabled is True, "GRPOTrainer no longer sets `_entropy_bonus_enabled`"
    inputs = two_on_policy_rows()
    with torch.no_grad():
        with_bonus = trainer._compute_loss(trainer.model, inputs).item()
        entropy = trainer._metrics["eval"]["entropy"][-1]
        trainer._entropy_bonus_enabled = False  # as `TeamEntropyBonus` sets it: the bonus is the package's
        without = trainer._compute_loss(trainer.model, inputs).item()
    # on-policy dapo: -sum(advantage) / tokens; the bonus subtracts 0.5 * the mean entropy of the 8 tokens
    assert without == pytest.approx(-(4 * 1.0 + 4 * 0.5) / 8), "the loss still holds an entropy bonus when disabled"
    assert with_bonus == pytest.approx(without - 0.5 * entropy, rel=1e-5)


@contract("trl", "GRPOTrainer._compute_loss", used_in="trainer.py, update/importance.py")
def test_compute_loss_weights_tokens_by_the_importance_sampling_ratio(tmp_path):
    trainer = grpo_trainer(tmp_path, loss_type="dapo")
    trainer.model.eval()  # no accumulation normaliser
    trainer.use_vllm, trainer.vllm_importance_sampling_correction = True, True  # as MAGRPOTrainer sets them
    inputs = two_on_policy_rows()
    # On-policy (no old log-probs): the ratio to the old policy is exactly 1, and the dapo loss is
    # -sum(advantage * importance ratio) / tokens, whatever the model.
    with torch.no_grad():
        plain = trainer._compute_loss(trainer.model, {**inputs, "importance_sampling_ratio": torch.ones(2, 4)})
        weighted = trainer._compute_loss(
            trainer.model,
            {**inputs, "importance_sampling_ratio": torch.tensor([[1.0, 2.0, 1.0, 1.0], [1.0, 1.0, 1.0, 3.0]])},
        )
    assert plain.item() == pytest.approx(-(4 * 1.0 + 4 * 0.5) / 8)
    assert weighted.item() == pytest.approx(-(5 * 1.0 + 6 * 0.5) / 8), "the ratio no longer weights each token"


@contract(
    "trl", "GRPOTrainer._compute_loss", "GRPOTrainer._get_per_token_logps_and_entropies",
    used_in="trainer.py, update/loss_call.py",
)  # fmt: skip
def test_compute_loss_runs_one_policy_forward_before_it_reads_the_ratio(tmp_path):
    """What `update.loss_call` relies on: one call of `_compute_loss` runs the policy's forward once, with entropies,
    and reads `importance_sampling_ratio` after it, so that a ratio set into the rows during that forward weights the
    loss (`RatioFromLoss`)."""
    trainer = grpo_trainer(tmp_path, loss_type="dapo")
    trainer.model.eval()  # no accumulation normaliser
    trainer.use_vllm, trainer.vllm_importance_sampling_correction = True, True  # as MAGRPOTrainer sets them
    inputs, forwards = two_on_policy_rows(), []
    stock = trainer._get_per_token_logps_and_entropies

    def forward(*args, **kwargs):
        result = stock(*args, **kwargs)
        forwards.append(kwargs.get("compute_entropy"))
        inputs["importance_sampling_ratio"] = torch.tensor([[1.0, 2.0, 1.0, 1.0], [1.0, 1.0, 1.0, 3.0]])
        return result

    trainer._get_per_token_logps_and_entropies = forward
    with torch.no_grad():
        loss = trainer._compute_loss(trainer.model, inputs)
    assert forwards == [True], "not one forward of the policy, with entropies, per call"
    assert loss.item() == pytest.approx(-(5 * 1.0 + 6 * 0.5) / 8), "the ratio is read before the forward"


@contract("trl", "GRPOTrainer._compute_loss", used_in="trainer.py, update/batching.py")
def test_loss_reads_the_inputs_we_build():
    source = inspect.getsource(GRPOTrainer._compute_loss)
    assert params(GRPOTrainer._compute_loss) == ["self", "model", "inputs"]
    for key in ["prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages", "num_items_in_batch",
                "old_per_token_logps", "ref_per_token_logps", "importance_sampling_ratio"]:  # fmt: skip
        assert f'"{key}"' in source, key
    assert 'completion_mask * inputs["tool_mask"]' in source


@contract("trl", "GRPOTrainer._compute_loss", used_in="update/chunking.py")
def test_loss_normalisations_are_the_ones_the_chunk_weights_assume():
    """`chunking.chunk_weight` mirrors how TRL's `_compute_loss` normalises each loss type; a TRL release that
    changes one (or adds a loss type) must fail here, not silently reweight the chunks."""
    from trl_multiagent.update.chunking import LOSS_TYPES

    source = inspect.getsource(GRPOTrainer._compute_loss)
    assert 'if self.loss_type in ["grpo", "sapo"]:' in source
    assert "((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()" in source  # per row, mean of rows
    assert "(per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)" in source  # bnpo: per token of the call
    assert "(per_token_loss.size(0) * self.max_completion_length)" in source  # dr_grpo: rows of the call
    assert 'elif self.loss_type in ["cispo", "dapo", "vespo"]:' in source
    assert 'inputs["num_items_in_batch"].clamp(min=1.0)' in source  # the generation batch's tokens
    assert "(per_token_loss * mask).sum(-1).mean()" in source  # luspo: rows of the call
    named = {name for name in LOSS_TYPES if f'"{name}"' in source}
    assert named == set(LOSS_TYPES)


@contract("trl", "GRPOTrainer._get_per_token_logps_and_entropies", used_in="trainer.py, update/prefix.py")
def test_per_token_logps_are_the_completion_tokens_log_probs(tmp_path):
    assert params(GRPOTrainer._get_per_token_logps_and_entropies)[:8] == [
        "self", "model", "input_ids", "attention_mask", "logits_to_keep", "batch_size", "compute_entropy",
        "compute_aux_loss",
    ]  # fmt: skip
    trainer = grpo_trainer(tmp_path, temperature=0.7)
    input_ids = torch.tensor([[5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16]])
    attention_mask, keep = torch.ones_like(input_ids), 3
    with torch.no_grad():
        # positionally, as MAGRPOTrainer calls the stock one
        logps, entropies, aux = trainer._get_per_token_logps_and_entropies(
            trainer.model, input_ids, attention_mask, keep, 2, True, False
        )
        logits = trainer.model(input_ids=input_ids, attention_mask=attention_mask).logits[:, -keep - 1 : -1] / 0.7
    expected = logits.log_softmax(-1).gather(-1, input_ids[:, -keep:, None]).squeeze(-1)
    torch.testing.assert_close(logps, expected, rtol=1e-4, atol=1e-5)
    assert entropies.shape == (2, keep) and aux is None


@contract("trl", "GRPOTrainer._get_tool_suffix_ids", used_in="rollout/tools.py")
def test_tool_suffix_ids_reads_only_what_the_team_gives_it():
    """`rollout.tools.ToolCalling.suffix_ids` calls TRL's private `GRPOTrainer._get_tool_suffix_ids` on a stand-in
    holding one agent's tokenizer and template. It must keep its signature, read no attribute beyond those, and give
    the tokens that append a tool message to an assistant turn."""
    from trl.chat_template_utils import add_response_schema

    from trl_multiagent.demo.testing import make_tool_tokenizer

    assert params(GRPOTrainer._get_tool_suffix_ids) == ["self", "tool_messages"]
    source = inspect.getsource(GRPOTrainer._get_tool_suffix_ids)
    given = {"processing_class", "_tokenizer", "chat_template", "chat_template_kwargs", "_is_vlm"}
    assert set(re.findall(r"self\.(\w+)", source)) <= given
    tokenizer = add_response_schema(make_tool_tokenizer())
    owner = types.SimpleNamespace(
        processing_class=tokenizer, _tokenizer=tokenizer, chat_template=None, chat_template_kwargs={}, _is_vlm=False
    )
    suffix = GRPOTrainer._get_tool_suffix_ids(owner, [{"role": "tool", "name": "add", "content": "5"}])
    assert tokenizer.decode(suffix) == (
        "\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


@contract("transformers", "Trainer._remove_unused_columns", used_in="trainer.py")
def test_remove_unused_columns_is_the_one_place_columns_are_dropped():
    from transformers import Trainer

    assert params(Trainer._remove_unused_columns) == ["self", "dataset", "description"]
    assert "_remove_unused_columns" not in vars(GRPOTrainer), "GRPOTrainer now overrides `_remove_unused_columns`"
    source = inspect.getsource(Trainer)
    assert "self._remove_unused_columns(" in source, "Trainer no longer drops columns through it"


@contract("trl", "GRPOTrainer._get_train_sampler", used_in="checkpoint.py, update/batching.py")
def test_train_sampler_order_is_drawn_from_its_generator(tmp_path):
    from trl_multiagent.update.batching import EpochSeededSampler

    assert params(GRPOTrainer._get_train_sampler) == ["self", "dataset"]
    trainer = grpo_trainer(tmp_path)
    sampler = trainer._get_train_sampler(trainer.train_dataset)
    assert sampler.shuffle is True and sampler.seed == trainer.args.seed
    assert isinstance(sampler.generator, torch.Generator)

    def order(seed):
        sampler.generator.manual_seed(seed)
        return list(sampler)

    assert order(5) == order(5) != order(6)
    wrapped = EpochSeededSampler(sampler)
    wrapped.set_epoch(3)
    assert list(wrapped) == order(trainer.args.seed + 3)


@contract("trl", "GRPOTrainer instance attributes", used_in="trainer.py")
def test_grpo_trainer_sets_the_attributes_the_subclass_reads(tmp_path):
    trainer = grpo_trainer(tmp_path)
    read = ["accelerator", "beta", "chat_template_kwargs", "generation_kwargs", "is_deepspeed_enabled",
            "log_completions", "loss_type", "mask_truncated_completions", "max_completion_length", "model_wrapped",
            "num_generations", "num_generations_eval", "num_iterations", "reward_funcs", "reward_processing_classes",
            "scale_rewards", "temperature", "use_vllm", "vllm_importance_sampling_correction"]  # fmt: skip
    missing = [name for name in read if not hasattr(trainer, name)]
    assert not missing, f"GRPOTrainer no longer sets {missing}"


class Counter:
    def reset(self, **row):
        return "Count."

    def increment(self, step: int) -> int:
        """Increment the counter.

        Args:
            step: Value to add.
        """
        return step

    def _helper(self):  # private: not a tool
        return None


class Echo:
    def reset(self, **row):
        return "Echo."

    def shout(self, text: str) -> str:
        """Shout the text.

        Args:
            text: Text to shout.
        """
        return text.upper()

    def get_reward(self) -> float:
        return 0.0


def shout_all(text: str) -> str:
    """Shout.

    Args:
        text: Text to shout.
    """
    return text.upper()


def environment_trainer(tmp_path, trainer_class, config_class, **extra):
    """A trainer with `tools=[shout_all]` and the two environments above (routed by the `environment` column)."""
    from trl_multiagent.demo.testing import make_tool_tokenizer

    tokenizer = make_tool_tokenizer()
    args = config_class(output_dir=str(tmp_path), num_generations=2, per_device_train_batch_size=2, report_to="none",
                        use_cpu=True, bf16=False, max_steps=1)  # fmt: skip
    return trainer_class(
        model=make_model(tokenizer, max_positions=2048), reward_funcs=length_reward, args=args, tools=[shout_all],
        train_dataset=Dataset.from_dict({"prompt": [[{"role": "user", "content": "go"}]] * 2,
                                         "environment": ["counter", "echo"]}),
        processing_class=tokenizer, environment_factory={"counter": Counter, "echo": Echo}, **extra,
    )  # fmt: skip


@contract("trl", "GRPOTrainer._env_tools", "GRPOTrainer._environment_pool", used_in="trainer.py, rollout/tools.py")
def test_env_tools_are_the_tools_then_the_probes_methods_and_the_pool_holds_the_probe(tmp_path):
    trainer = environment_trainer(tmp_path, GRPOTrainer, GRPOConfig)
    pool, tools = trainer._environment_pool, trainer._env_tools
    assert list(pool) == ["counter", "echo"] and [len(pool[name]) for name in pool] == [1, 1]
    assert isinstance(pool["counter"][0], Counter) and isinstance(pool["echo"][0], Echo)
    assert {name: [t.__name__ for t in tools[name]] for name in tools} == {
        "counter": ["shout_all", "increment"],
        "echo": ["shout_all", "shout"],
    }
    assert tools["counter"][1].__self__ is pool["counter"][0] and tools["echo"][1].__self__ is pool["echo"][0]


@contract("trl", "add_fused_lm_head", "forward", used_in="trainer.py, update/prefix.py")
def test_fused_head_is_a_forward_attribute_that_del_removes(tmp_path):
    from trl_multiagent.team.agent_team import AgentTeam

    assert params(add_fused_lm_head) == ["model", "temperature", "cast_lm_head_to_fp32", "outputs"]
    # GRPOTrainer patches the model it is given (for MAGRPOTrainer, the team) with an instance attribute.
    trainer = grpo_trainer(tmp_path)
    assert "forward" in vars(trainer.model), "GRPOTrainer no longer sets `forward` on the model it is given"
    tokenizer = make_tokenizer()
    agent = make_model(tokenizer)
    team = AgentTeam([agent])
    add_fused_lm_head(team, temperature=1.0, outputs=("log_probs", "entropy"))  # as GRPOTrainer.__init__ does
    assert "forward" in vars(team)
    del team.forward
    assert team.forward.__func__ is AgentTeam.forward, "`del team.forward` does not give back the team's forward"
    add_fused_lm_head(agent, temperature=1.0, outputs=("log_probs", "entropy"))  # as MAGRPOTrainer does per agent
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        out = agent(input_ids=ids, labels=ids, fused_lm_head=True)
        logits = agent(input_ids=ids).logits  # without the flag: the original forward
    expected = logits[:, :-1].log_softmax(-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    torch.testing.assert_close(out.log_probs, expected, rtol=1e-4, atol=1e-5)
    assert out.entropy is not None and out.entropy.shape == expected.shape
    # The patch keeps the forward it wraps in a closure: a deep copy's plain forward runs the original's weights,
    # until the copy drops the copied patch and gets one of its own (`team.assembly.add_fused_heads`).
    copy = __import__("copy").deepcopy(agent)
    with torch.no_grad():
        copy.model.norm.weight.mul_(2.0)  # the final norm scales the logits
        assert torch.equal(copy(input_ids=ids).logits, logits), "a copied fused head no longer runs the original"
        copy.__dict__.pop("forward")
        add_fused_lm_head(copy, temperature=1.0, outputs=("log_probs", "entropy"))
        torch.testing.assert_close(copy(input_ids=ids).logits, 2.0 * logits)


@contract("trl", "_unwrap_model_for_generation", used_in="generation/hf.py")
def test_unwrap_model_for_generation_yields_the_team_without_checkpointing(tmp_path):
    from trl_multiagent.team.agent_team import AgentTeam

    assert params(_unwrap_model_for_generation)[:3] == ["model", "accelerator", "gather_deepspeed3_params"]
    accelerator = grpo_trainer(tmp_path).accelerator
    team = AgentTeam([make_model(make_tokenizer())])
    team.gradient_checkpointing_enable({"use_reentrant": False})
    with (
        disable_gradient_checkpointing(team, {"use_reentrant": False}),  # as generation/hf.py does, first
        _unwrap_model_for_generation(team, accelerator, gather_deepspeed3_params=False) as unwrapped,
    ):
        assert unwrapped is team
        assert not team.is_gradient_checkpointing
    assert team.is_gradient_checkpointing
    functions = [layer._gradient_checkpointing_func for layer in checkpointed_layers(team)]
    assert functions and all(f.keywords.get("use_reentrant") is False for f in functions)  # the kwargs kept


@contract("trl", *("disable_gradient_checkpointing", "add_hooks", "remove_hooks", "prepare_deepspeed", "pad",
                   "ensure_master_addr_port"), used_in="trainer.py, generation/, team/assembly.py, update/batching.py")  # fmt: skip
def test_called_helpers_keep_their_signatures():
    assert params(disable_gradient_checkpointing) == ["model", "gradient_checkpointing_kwargs"]
    assert params(add_hooks) == ["model"] and params(remove_hooks) == ["model"]
    assert params(prepare_deepspeed) == ["model", "accelerator"]
    assert params(pad) == ["tensors", "padding_value", "padding_side", "pad_to_multiple_of"]
    assert params(ensure_master_addr_port) == ["addr", "port"]


@contract("trl", "GRPOConfig.__post_init__", used_in="comlrl/trainers/actor_critic/config.py")
def test_one_generation_is_refused_after_every_check_but_the_vllm_sampling_ones(tmp_path):
    from trl_multiagent.comlrl.trainers.actor_critic.config import ONE_GENERATION_REFUSAL

    with pytest.raises(ValueError) as refused:
        GRPOConfig(str(tmp_path), num_generations=1, per_device_train_batch_size=1, use_cpu=True, bf16=False)
    assert str(refused.value).startswith(ONE_GENERATION_REFUSAL)
    source = inspect.getsource(GRPOConfig.__post_init__)
    assert source.count("if self.num_generations < 2:") == 1
    after = source.split("if self.num_generations < 2:", 1)[1]
    read = set(re.findall(r"self\.(\w+)", after)) - {"num_generations"}
    assert read and all(name.startswith("vllm_importance_sampling_") for name in read), sorted(read)


# What `arguments.grpo_trainer_settings` sets for `GRPOTrainer.__init__`, each with how __init__ reads it: the line
# that reads it, then what follows that the setting is there to turn off (or, for `reward_weights`, to fill), in order.
GRPO_INIT_READS = {
    "beta": ["self.beta = args.beta", "if self.beta == 0.0:", "self.ref_model = None"],
    "use_vllm": [
        "self.use_vllm = args.use_vllm", "if self.use_vllm:", "self.vllm_generation = VLLMGeneration(", "\n        else:",
        "self.generation_kwargs = generation_kwargs",
    ],  # `if self.use_vllm:` comes late in __init__, after everything it needs
    "model_init_kwargs": ["if args.model_init_kwargs is not None:", "will be ignored"],
    "cast_lm_head_to_fp32": ["if args.cast_lm_head_to_fp32:", "target_model.lm_head"],
    "sync_ref_model": ["if args.sync_ref_model:", "if self.beta == 0.0:", "raise ValueError"],
    "reward_weights": [
        "if args.reward_weights is not None:", "if len(args.reward_weights) != len(reward_funcs):",
        "self.reward_weights = torch.tensor(args.reward_weights",
    ],
}  # fmt: skip


def read_in_order(source: str, pieces: list[str], within: int = 3000) -> bool:
    """Whether `pieces` appear in `source` in order, each within `within` characters of the one before (the first
    two of `use_vllm` excepted)."""
    at = source.find(pieces[0])
    for piece in pieces[1:]:
        following = source.find(piece, at)
        if at < 0 or following < 0 or (following - at > within and piece != "if self.use_vllm:"):
            return False
        at = following
    return at >= 0


@contract("trl", "GRPOTrainer.__init__", used_in="arguments/grpo.py, trainer.py")
def test_grpo_init_reads_the_settings_the_team_gives_it():
    source = inspect.getsource(GRPOTrainer.__init__)
    unread = [name for name, pieces in GRPO_INIT_READS.items() if not read_in_order(source, pieces)]
    assert unread == [], f"GRPOTrainer.__init__ no longer reads these as grpo_trainer_settings assumes: {unread}"
    # every setting `grpo_trainer_settings` makes is one of these, and __init__ reads no other of them from elsewhere
    from trl_multiagent.arguments.grpo import SETTINGS_FOR_GRPO_INIT

    assert set(SETTINGS_FOR_GRPO_INIT) == set(GRPO_INIT_READS)
    assert not re.search(r"getattr\(\s*args", source)


# ====================================================================== transformers


@contract("transformers", "Trainer.current_gradient_accumulation_steps", used_in="trainer.py")
def test_current_gradient_accumulation_steps_is_the_window_of_each_micro_step(trained):
    assert [window for _, window, _ in trained.steps] == [2, 2], trained.steps


@contract("transformers", "Trainer._get_output_dir", used_in="checkpoint.py")
def test_output_dir_without_a_trial_is_the_runs(tmp_path):
    assert params(Trainer._get_output_dir) == ["self", "trial"]
    assert grpo_trainer(tmp_path)._get_output_dir(trial=None) == str(tmp_path)
    assert "self._get_output_dir(trial=trial)" in inspect.getsource(Trainer._save_checkpoint)


@contract(
    "transformers", "Trainer._save_checkpoint", "rotate_checkpoints", "Trainer._get_output_dir",
    used_in="checkpoint.py, comlrl/trainer.py",
)  # fmt: skip
def test_save_checkpoint_reads_the_args_bound_for_the_call_and_rotates_last(tmp_path):
    # `TeamCheckpointing.write_complete_checkpoint` runs `_save_checkpoint` with `self.args` bound to a copy
    # (`args_for_one_call`): the Trainer must read output_dir, save_only_model and save_total_limit from `self.args`
    # when called, write into `_get_output_dir`'s folder, and rotate last, after every file it writes.
    source = inspect.getsource(Trainer._save_checkpoint)
    order = [
        "run_dir = self._get_output_dir(trial=trial)",
        "self.save_model(output_dir",
        "if not self.args.save_only_model:",
        "self._save_optimizer_and_scheduler(output_dir)",
        "self.state.save_to_json(",
        "rotate_checkpoints(",
    ]
    found = [source.find(line) for line in order]
    assert -1 not in found and found == sorted(found), dict(zip(order, found, strict=True))
    assert source.count("rotate_checkpoints(") == 1
    assert "save_total_limit=self.args.save_total_limit" in source[found[-1] :]
    # behaviour: with the limit on a copy bound as `args`, the copy's None keeps every checkpoint; the limit, not
    trainer = grpo_trainer(tmp_path, save_only_model=True, save_total_limit=1)
    for step in (1, 2):
        trainer.state.global_step = step
        configured = trainer.args
        trainer.args = copy.copy(configured)
        trainer.args.save_total_limit, trainer.args.output_dir = None, str(tmp_path / "elsewhere")
        try:
            trainer._save_checkpoint(trainer.model, trial=None)
        finally:
            trainer.args = configured
    checkpoints = lambda: sorted(p.name for p in (tmp_path / "elsewhere").glob("checkpoint-*"))  # noqa: E731
    assert checkpoints() == ["checkpoint-1", "checkpoint-2"]
    trainer.args.output_dir = str(tmp_path / "elsewhere")  # the config's limit, 1, read at the call
    trainer.state.global_step = 3
    trainer._save_checkpoint(trainer.model, trial=None)
    assert checkpoints() == ["checkpoint-3"]


@contract(
    "transformers", "Trainer._save_optimizer_and_scheduler", "Trainer._save_checkpoint",
    used_in="update/entropy.py, comlrl/trainers/actor_critic/trainer.py",
)  # fmt: skip
def test_save_optimizer_and_scheduler_writes_into_the_checkpoint_being_saved(tmp_path):
    # The entropy coefficients and the critics' AdamW states are written by an override of this method: it must get
    # the checkpoint's own folder, on every process (DeepSpeed saves its optimizer shards there collectively).
    assert params(Trainer._save_optimizer_and_scheduler) == ["self", "output_dir"]
    seen = []

    class Recording(GRPOTrainer):
        def _save_optimizer_and_scheduler(self, output_dir):
            super()._save_optimizer_and_scheduler(output_dir)
            seen.append((output_dir, sorted(os.listdir(output_dir))))

    trainer = grpo_trainer(tmp_path, trainer_class=Recording)
    trainer.create_optimizer_and_scheduler(num_training_steps=1)
    trainer.state.global_step = 7
    trainer._save_checkpoint(trainer.model, trial=None)
    ((folder, files),) = seen
    assert folder == str(tmp_path / "checkpoint-7") and {"optimizer.pt", "scheduler.pt"} <= set(files), seen


@contract("transformers", "Trainer._load_optimizer_and_scheduler", used_in="update/entropy.py")
def test_load_optimizer_and_scheduler_gets_the_resumed_checkpoint():
    assert params(Trainer._load_optimizer_and_scheduler) == ["self", "checkpoint"]
    assert "self._prepare_for_training(max_steps, train_dataloader, resume_from_checkpoint)" in inspect.getsource(
        Trainer._inner_training_loop
    )
    source = inspect.getsource(Trainer._prepare_for_training)
    # after the weights, on every path (DeepSpeed's too: in the `if`, not in a branch of it), the resumed checkpoint's
    # optimizer and scheduler
    assert re.search(
        r"\n( +)if resume_from_checkpoint is not None:\n\1    if self\.is_deepspeed_enabled:\n.*deepspeed_load_checkpoint"
        r".*\n\1    self\._load_optimizer_and_scheduler\(resume_from_checkpoint\)\n",
        source,
        re.S,
    )


@contract(
    "transformers", "Trainer._save", "Trainer._save_checkpoint", "Trainer._load_from_checkpoint", "rotate_checkpoints",
    used_in="checkpoint.py",
)  # fmt: skip
def test_overridden_methods_keep_their_signatures():
    assert params(GRPOTrainer.compute_loss) == ["self", "model", "inputs", "return_outputs", "num_items_in_batch"]
    assert params(Trainer._save) == ["self", "output_dir", "state_dict"]
    assert params(Trainer._load_from_checkpoint) == ["self", "resume_from_checkpoint", "model"]
    assert params(Trainer._save_checkpoint) == ["self", "model", "trial"]
    assert params(Trainer.train)[:3] == ["self", "resume_from_checkpoint", "trial"]
    assert params(rotate_checkpoints) == [
        "output_dir", "save_total_limit", "best_model_checkpoint", "use_mtime", "checkpoint_prefix",
    ]  # fmt: skip
    # The rotation inside Trainer._save_checkpoint is what MAGRPOTrainer defers until the completion marker.
    assert "rotate_checkpoints(" in inspect.getsource(Trainer._save_checkpoint)
    assert "save_total_limit=self.args.save_total_limit" in inspect.getsource(Trainer._save_checkpoint)


@contract("transformers", "GradientCheckpointingLayer._can_checkpoint_with_cache", used_in="update/prefix.py")
def test_can_checkpoint_with_cache_keeps_the_cache_of_a_checkpointed_layer():
    from transformers import DynamicCache
    from transformers.modeling_layers import GradientCheckpointingLayer

    assert GradientCheckpointingLayer._can_checkpoint_with_cache is False
    model = make_model(make_tokenizer())
    enable_checkpointing(model, use_reentrant=False)
    model.train()
    layers = checkpointed_layers(model)
    # transformers 5.24 passes the cache as `cache`, earlier releases as `past_key_values`
    name = "cache" if "cache" in inspect.signature(type(model).forward).parameters else "past_key_values"
    ids = torch.tensor([[5, 6, 7, 8]])

    def cached_tokens():
        cache = DynamicCache(config=model.config)
        model(input_ids=ids, use_cache=True, **{name: cache})
        return cache.get_seq_length()

    assert cached_tokens() == 0  # a checkpointed layer drops the cache...
    for layer in layers:
        layer._can_checkpoint_with_cache = True
    assert cached_tokens() == ids.size(1)  # ...unless it may keep it
    for layer in layers:
        del layer._can_checkpoint_with_cache
    assert all(layer._can_checkpoint_with_cache is False for layer in layers)


@contract("transformers", "GradientCheckpointingLayer._gradient_checkpointing_func", used_in="update/prefix.py")
def test_gradient_checkpointing_func_keywords_hold_use_reentrant():
    from trl_multiagent.update.prefix import uses_reentrant_checkpointing

    model = make_model(make_tokenizer())
    for reentrant in (False, True):
        enable_checkpointing(model, use_reentrant=reentrant)
        functions = [layer._gradient_checkpointing_func for layer in checkpointed_layers(model)]
        assert functions and all(isinstance(f, functools.partial) for f in functions), functions
        assert all(f.keywords.get("use_reentrant") is reentrant for f in functions)
        assert uses_reentrant_checkpointing(model) is reentrant


@contract("transformers", "PreTrainedModel.should_save_on_this_rank", used_in="checkpoint.py")
def test_save_pretrained_asks_should_save_on_this_rank(tmp_path):
    from transformers.utils import SAFE_WEIGHTS_NAME

    model = make_model(make_tokenizer())
    assert params(type(model).should_save_on_this_rank) == ["self", "is_main_process"]
    for writes in (False, True):
        model.should_save_on_this_rank = lambda is_main_process, writes=writes: writes
        model.save_pretrained(tmp_path / str(writes))
        assert os.path.isfile(tmp_path / str(writes) / SAFE_WEIGHTS_NAME) is writes
    del model.should_save_on_this_rank


@contract("transformers", "PreTrainedModel._tied_weights_keys", "all_tied_weights_keys", used_in="checkpoint.py")
def test_tied_weights_left_out_of_the_file_are_listed(tmp_path):
    from safetensors.torch import load_file
    from transformers.utils import SAFE_WEIGHTS_NAME

    tokenizer = make_tokenizer()
    make_model(tokenizer, tied=True).save_pretrained(tmp_path)
    agent = make_model(tokenizer, seed=1, tied=True)
    missing = agent.load_state_dict(load_file(tmp_path / SAFE_WEIGHTS_NAME), strict=False).missing_keys
    tied = set(getattr(agent, "all_tied_weights_keys", {}) or {}) | set(
        getattr(agent, "_tied_weights_keys", None) or []
    )
    assert missing and set(missing) <= tied, (missing, tied)


@contract("transformers", "PretrainedConfig._name_or_path", used_in="team/assembly.py, rewards/models.py, comlrl/")
def test_config_name_or_path_is_where_the_model_came_from(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(tiny_model_dir).config._name_or_path == tiny_model_dir


# ====================================================================== accelerate


@contract("accelerate", "GradientState._set_sync_gradients", used_in="distributed.py")
def test_set_sync_gradients_turns_gradient_reduction_off():
    from accelerate import Accelerator
    from accelerate.state import GradientState
    from accelerate.utils.deepspeed import DeepSpeedEngineWrapper

    accelerator = Accelerator(cpu=True)
    state = accelerator.gradient_state
    assert isinstance(state, GradientState)
    before = state.sync_gradients
    try:
        state._set_sync_gradients(False)
        assert state.sync_gradients is False and accelerator.sync_gradients is False
        state._set_sync_gradients(True)
        assert state.sync_gradients is True and accelerator.sync_gradients is True
    finally:
        state.sync_gradients = before
    # Under DeepSpeed, accelerate's backward hands the flag to its engine wrapper, which steps only when it is True.
    assert "sync_gradients=self.sync_gradients" in inspect.getsource(Accelerator.backward)
    assert params(DeepSpeedEngineWrapper.backward)[:3] == ["self", "loss", "sync_gradients"]


# ====================================================================== PEFT


@contract("peft", "BaseTunerLayer._active_adapter", used_in="team/agent_team.py")
def test_active_adapter_routes_each_layer_without_touching_requires_grad():
    from peft import LoraConfig, get_peft_model
    from peft.tuners.tuners_utils import BaseTunerLayer

    def lora():
        return LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)

    torch.manual_seed(0)
    model = get_peft_model(make_model(make_tokenizer()), lora(), adapter_name="agent_0")
    model.add_adapter("agent_1", lora())
    layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
    requires_grad = {name: p.requires_grad for name, p in model.named_parameters()}
    ids = torch.tensor([[5, 6, 7, 8]])

    def activate(name):  # as AgentTeam._activate
        for layer in layers:
            layer._active_adapter = [name]
        model.base_model.active_adapter = name

    outputs = {}
    with torch.no_grad():
        for name in ("agent_0", "agent_1"):
            activate(name)
            assert model.active_adapters == [name] and all(layer.active_adapters == [name] for layer in layers)
            outputs[name] = model(input_ids=ids).logits
    assert not torch.allclose(outputs["agent_0"], outputs["agent_1"]), "the active adapter made no difference"
    assert {name: p.requires_grad for name, p in model.named_parameters()} == requires_grad
    model.set_adapter("agent_0")
    assert all(layer._active_adapter == ["agent_0"] for layer in layers)
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, outputs["agent_0"])


@contract("peft", "AuxiliaryTrainingWrapper._active_adapter", used_in="team/agent_team.py")
def test_a_modules_to_save_wrapper_runs_the_copy_it_is_pointed_to_without_touching_requires_grad():
    from peft import LoraConfig, get_peft_model
    from peft.utils.other import AuxiliaryTrainingWrapper

    torch.manual_seed(0)
    config = LoraConfig(r=4, target_modules=["q_proj"], modules_to_save=["lm_head"], init_lora_weights=False)
    model = get_peft_model(make_model(make_tokenizer()), config)
    model.add_adapter("ref", config)
    wrappers = [m for m in model.modules() if isinstance(m, AuxiliaryTrainingWrapper)]
    (head,) = wrappers
    assert head._active_adapter == "default" and set(head.modules_to_save) == {"default", "ref"}
    with torch.no_grad():
        head.modules_to_save["ref"].weight.mul_(2.0)
    requires_grad = {name: p.requires_grad for name, p in model.named_parameters()}
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        policy = model(input_ids=ids).logits
        head._active_adapter = "ref"  # as `_point_adapters`
        assert head.weight is head.modules_to_save["ref"].weight  # what the fused log-prob head reads
        pointed = model.get_base_model().lm_head(torch.ones(1, head.in_features))
        expected = torch.ones(1, head.in_features) @ head.modules_to_save["ref"].weight.T
        torch.testing.assert_close(pointed, expected)
        head._active_adapter = "default"
        torch.testing.assert_close(model(input_ids=ids).logits, policy)
    assert {name: p.requires_grad for name, p in model.named_parameters()} == requires_grad


# ====================================================================== torch


@contract("torch", "_checkpoint_wrapped_module", used_in="generation/vllm_colocate.py")
def test_checkpoint_wrapper_prefix_is_what_the_weight_sync_strips():
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    model[0] = checkpoint_wrapper(model[0])
    names = [name for name, _ in model.named_parameters()]
    assert names == ["0._checkpoint_wrapped_module.weight", "0._checkpoint_wrapped_module.bias"], names
    assert [name.replace("_checkpoint_wrapped_module.", "") for name in names] == ["0.weight", "0.bias"]


# ====================================================================== vLLM (one CPU engine)


@pytest.fixture(scope="module")
def vllm_engine(tmp_path_factory):
    """One in-process engine on dummy weights, built as `VLLMColocateGenerator` builds a full-weight agent's."""
    from accelerate import PartialState
    from vllm import LLM

    from trl_multiagent.devices import has_accelerator
    from trl_multiagent.generation import vllm_cpu
    from trl_multiagent.generation.vllm_process import kept_for_training
    from trl_multiagent.generation.vllm_settings import prepare_environment

    prepare_environment(PartialState())  # VLLM_ENABLE_V1_MULTIPROCESSING=0: the engine lives in this process
    if not has_accelerator():
        vllm_cpu.keep_linear_weights()
    tokenizer = make_tokenizer()
    model = make_model(tokenizer, hidden=64, heads=2)  # as test_vllm.vllm_model: vLLM-CPU needs head_dim >= 32
    folder = tmp_path_factory.mktemp("vllm-contract")
    model.config.save_pretrained(folder)
    with kept_for_training():
        llm = LLM(
            model=str(folder), dtype="float32", seed=0, max_model_len=64, max_num_seqs=4, load_format="dummy",
            distributed_executor_backend="external_launcher", skip_tokenizer_init=True, generation_config="vllm",
            enforce_eager=not has_accelerator(),
        )  # fmt: skip
    yield types.SimpleNamespace(llm=llm, hf_model=model, on_cpu=not has_accelerator())
    finalizer = getattr(llm.llm_engine.engine_core, "_finalizer", None)
    if finalizer is not None:
        with contextlib.suppress(ValueError, RuntimeError):
            finalizer()


def hf_greedy(model, prompt: list[int], new_tokens: int) -> list[int]:
    ids = torch.tensor([prompt])
    with torch.no_grad():
        for _ in range(new_tokens):
            ids = torch.cat([ids, model(input_ids=ids).logits[:, -1:].argmax(-1)], dim=1)
    return ids[0, len(prompt) :].tolist()


@pytest.mark.vllm
@contract(
    "vllm", "LLMEngine.model_executor.driver_worker.model_runner.model", used_in="generation/vllm_colocate.py"
)  # fmt: skip
def test_vllm_engine_model_is_reachable_and_loads_weights(vllm_engine):
    from trl_multiagent.generation.vllm_colocate import engine_model

    model = vllm_engine.llm.llm_engine.model_executor.driver_worker.model_runner.model
    assert isinstance(model, torch.nn.Module) and engine_model(vllm_engine.llm) is model
    model.load_weights((name, param.data) for name, param in vllm_engine.hf_model.named_parameters())
    embedding = vllm_engine.hf_model.get_input_embeddings().weight
    loaded = dict(model.named_parameters())["model.embed_tokens.weight"]
    torch.testing.assert_close(loaded[: embedding.size(0)], embedding)


@pytest.mark.vllm
@contract(
    "vllm", "vllm.model_executor.layers.utils.dispatch_cpu_unquantized_gemm", "cpu_linear",
    used_in="generation/vllm_cpu.py",
)  # fmt: skip
def test_vllm_cpu_layers_keep_their_weights_and_repack(vllm_engine):
    import vllm.model_executor.layers.utils as utils
    from vllm import SamplingParams

    from trl_multiagent.generation import vllm_cpu

    if not vllm_engine.on_cpu:
        pytest.skip("vLLM packs linear weights this way on CPU only")
    assert params(vllm_cpu._original_packing()) == ["layer", "remove_weight"]
    assert getattr(utils.dispatch_cpu_unquantized_gemm, "_keeps_weights", False), "keep_linear_weights not in place"
    model = vllm_engine.llm.llm_engine.model_executor.driver_worker.model_runner.model
    packed = [m for m in model.modules() if hasattr(m, "cpu_linear")]
    assert packed and all(m.weight.numel() > 0 for m in packed)
    model.load_weights((name, param.data) for name, param in vllm_engine.hf_model.named_parameters())
    assert vllm_cpu.repack(model) == len(packed)
    prompt = make_tokenizer()("Describe a city in the clouds:")["input_ids"]
    sampling = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, detokenize=False)
    output = vllm_engine.llm.generate([{"prompt_token_ids": prompt}], sampling_params=sampling, use_tqdm=False)
    assert list(output[0].outputs[0].token_ids) == hf_greedy(vllm_engine.hf_model, prompt, 6)


@pytest.mark.vllm
@contract(
    "vllm", "LLMEngine.model_config.max_model_len", "LLMEngine.remove_lora", used_in="generation/vllm_colocate.py"
)  # fmt: skip
def test_vllm_engine_context_length_and_lora_removal(vllm_engine):
    engine = vllm_engine.llm.llm_engine
    assert engine.model_config.max_model_len == 64
    assert params(engine.remove_lora) == ["lora_id"]


@pytest.mark.vllm
@contract("vllm", "LLMEngine.engine_core._finalizer", used_in="generation/vllm_colocate.py")
def test_vllm_engine_core_finalizer_shuts_down_once(vllm_engine):
    """Last of the vLLM tests: it shuts the module's engine down."""
    finalizer = vllm_engine.llm.llm_engine.engine_core._finalizer
    assert isinstance(finalizer, weakref.finalize) and finalizer.alive
    finalizer()
    assert not finalizer.alive
    assert finalizer() is None  # a second call does nothing


# ====================================================================== the list itself


def contracts() -> dict[str, tuple[str, tuple[str, ...]]]:
    return {name: test.contract for name, test in globals().items() if hasattr(test, "contract")}


def test_every_contract_is_listed_in_the_docstring():
    missing = [
        (test, name)
        for test, (_, names) in contracts().items()
        for name in names
        if name not in __doc__.replace("`", "")
    ]
    assert not missing, f"contracts not described in this module's docstring: {missing}"


def test_every_contract_names_where_the_package_uses_it():
    """`used_in` names files or folders of `trl_multiagent/` that exist (a module moved takes its contracts along)."""
    package = pathlib.Path(__file__).resolve().parent.parent / "trl_multiagent"
    gone = [
        (name, place)
        for name, test in globals().items()
        if hasattr(test, "contract")
        for place in test.used_in.split(", ")
        if not (package / place).exists()
    ]
    assert gone == [], f"contracts naming places that are not in trl_multiagent/: {gone}"


# Private names the package uses that a library file below also defines, but which are the package's own.
OWN_NAMES = {"_generate"}  # TransformersGenerator._generate (GRPOTrainer has one too; unrelated)
LIBRARY_FILES = {
    "trl": ["trainer/grpo_trainer.py", "trainer/utils.py", "models/utils.py"],
    "transformers": ["trainer.py", "modeling_utils.py", "modeling_layers.py", "configuration_utils.py"],
    "accelerate": ["state.py", "accelerator.py"],
    "peft": ["tuners/tuners_utils.py", "peft_model.py"],
    "vllm": ["entrypoints/llm.py", "v1/engine/llm_engine.py", "v1/engine/core_client.py"],  # where installed
}


def test_every_private_name_the_package_uses_is_listed():
    """A private name the package reads or writes (`x._name`, `getattr(x, "_name")`, `from lib import _name`) that
    one of these libraries' main files defines must be in this module's docstring, with a contract test."""
    used = {}
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text()
        names = re.findall(r"\.(_[a-z]\w*)\b", text) + re.findall(r"""["'](_[a-z]\w*)["']""", text)
        for library in LIBRARY_FILES:
            for imported in re.findall(rf"^\s*from {library}[\w.]* import (\([^)]*\)|.+)$", text, re.M):
                names += [n for n in re.split(r"[\s,()]+", imported) if n.startswith("_")]
        for name in names:
            used.setdefault(name, set()).add(str(path.relative_to(PACKAGE)))
    defined = set()
    for library, files in LIBRARY_FILES.items():
        try:
            root = pathlib.Path(importlib.import_module(library).__file__).parent
        except ImportError:
            continue
        for relative in files:
            text = (root / relative).read_text()
            for groups in re.findall(
                r"\b(?:self|cls)\.(_[a-z]\w*)\b|\bdef (_[a-z]\w*)|^    (_[a-z]\w*)\s*[:=]", text, re.M
            ):
                defined.update(name for name in groups if name)
    unlisted = {
        name: sorted(used[name])
        for name in set(used) & defined - OWN_NAMES
        if not re.search(rf"(?<![\w]){name}\b", __doc__)
    }
    assert not unlisted, f"private library names the package uses, not under contract here: {unlisted}"


def test_a_removed_api_fails_its_contract_naming_it(monkeypatch, tmp_path):
    import accelerate
    from accelerate.state import GradientState

    monkeypatch.delattr(GradientState, "_set_sync_gradients")
    with pytest.raises(
        ContractBroken,
        match=rf"^accelerate {re.escape(accelerate.__version__)}: .*`GradientState._set_sync_gradients`",
    ):
        test_set_sync_gradients_turns_gradient_reduction_off()
    monkeypatch.delattr(GRPOTrainer, "_get_tool_suffix_ids")
    with pytest.raises(
        ContractBroken, match=rf"^trl {re.escape(trl.__version__)}: .*`GRPOTrainer._get_tool_suffix_ids`"
    ):
        test_tool_suffix_ids_reads_only_what_the_team_gives_it()
    # A changed behaviour, not only a removed name: `log` no longer averaging `_metrics`.
    monkeypatch.setattr(GRPOTrainer, "log", lambda self, logs, start_time=None: Trainer.log(self, logs, start_time))
    with pytest.raises(ContractBroken, match=r"`GRPOTrainer._metrics`.*KeyError"):
        test_metrics_appended_per_mode_are_averaged_by_log(tmp_path)
