"""A CoMLRL 1.4.3 MAGRPO script runs with its import changed: its config fields and trainer arguments work here with
the same meaning, or are refused, naming what to write instead, before anything is loaded."""

import glob
import os

import pytest
from conftest import SEED_PROMPTS, length_feedback
from datasets import Dataset

from trl_multiagent.comlrl import MAGRPOConfig, MAGRPOTrainer


def comlrl_config(tmp_path, **overrides):
    """The config of a typical CoMLRL script: CoMLRL's own names throughout."""
    values = dict(
        output_dir=str(tmp_path / "run"), num_train_epochs=1, agent_learning_rate=1e-3, logging_steps=1, num_agents=2,
        parallel_training="none", agent_devices=None, num_generations=2, max_new_tokens=6, temperature=0.8,
        top_p=0.95, top_k=50, num_turns=2, discount=0.9, joint_mode="aligned", early_termination_threshold=None,
        external_prompt_passthrough=True, eval_interval=4, eval_num_samples=2, eval_batch_size=1,
        advantage_normalization=True, advantage_mode="rloo", reference_kl_enabled=False, reference_kl_coef=0.1,
        reference_devices=None, report_to="none", seed=0,
    )  # fmt: skip
    values.update(overrides)
    return MAGRPOConfig(**values)


def test_config_fields_map_to_their_equivalents(tmp_path):
    config = comlrl_config(tmp_path)
    assert config.learning_rate == 1e-3
    assert config.advantage_baseline == "rloo" and config.scale_rewards == "group_zscore" and config.beta == 0.0
    # read back in CoMLRL's terms, as CoMLRL's tests read them
    assert (config.agent_learning_rate, config.num_agents, config.eval_num_samples, config.eval_interval) == (
        1e-3, 2, 2, 4,
    )  # fmt: skip
    assert config.external_prompt_passthrough and config.advantage_mode == "rloo" and config.advantage_normalization
    assert not config.reference_kl_enabled and config.reference_kl_coef == 0.1 and config.parallel_training == "none"
    assert config.comlrl_batch_sizes["eval_batch_size"] == 1  # CoMLRL's prompts; TrainingArguments' counts rows
    # CoMLRL evaluates every 4 one-prompt steps; a step here takes one prompt too (rollout_buffer_size=2 nodes)
    assert config.eval_strategy == "steps" and config.eval_steps == 4 and config.eval_on_start
    assert config.per_device_eval_batch_size == 2  # 1 prompt x K rows
    # TrainingArguments' own properties keep their meaning (rows per device times devices)
    assert config.train_batch_size == config.per_device_train_batch_size
    raw = comlrl_config(tmp_path, advantage_mode="raw", advantage_normalization=False, reference_kl_enabled=True)
    assert raw.advantage_baseline == "none" and raw.scale_rewards == "none" and raw.beta == 0.1


def test_comlrl_names_are_flags_of_this_face_only():
    from trl import TrlParser

    import trl_multiagent

    comlrl_names = {"agent_learning_rate", "advantage_mode", "eval_interval", "rollout_buffer_size"}
    flags = {action.dest for action in TrlParser((MAGRPOConfig,))._actions}
    assert {"learning_rate", "advantage_baseline", "num_turns", "num_agents"} | comlrl_names <= flags
    (config,) = TrlParser((MAGRPOConfig,)).parse_args_and_config(
        ["--agent_learning_rate", "1e-4", "--output_dir", "o"]
    )
    assert config.learning_rate == 1e-4
    trl_flags = {action.dest for action in TrlParser((trl_multiagent.MAGRPOConfig,))._actions}
    assert not trl_flags & comlrl_names


@pytest.mark.parametrize(
    "field, value, says",
    [
        ("parallel_training", "mp", "needs agent_devices"),
        ("agent_devices", ["cuda:0", "cuda:1"], "accelerate launch --config_file accelerate_configs/multi_gpu.yaml"),
        ("reference_devices", ["cuda:1"], "accelerate launch"),
        ("advantage_mode", "median", "advantage_baseline"),
    ],
)
def test_fields_without_equivalent_are_refused_with_what_to_write(tmp_path, field, value, says):
    with pytest.raises(ValueError, match=f"MAGRPOConfig: {field}") as raised:
        comlrl_config(tmp_path, **{field: value})
    assert says in str(raised.value)


def test_a_comlrl_name_and_its_equivalent_must_agree(tmp_path):
    with pytest.raises(
        ValueError, match=r"agent_learning_rate=0.001 \(CoMLRL\) sets learning_rate=0.001, but learning_rate=0.1"
    ):
        comlrl_config(tmp_path, learning_rate=0.1)


def test_comlrl_script_trains_and_evaluates(tmp_path, tokenizer, tiny_model_dir):
    """CoMLRL's trainer surface: `agent_model` (an id, copied `num_agents` times), one formatter for every agent, a
    reward processor, an eval dataset evaluated every `eval_interval` prompts, `model_config`."""
    seen = []

    def formatter(row):
        seen.append(row["prompt"])
        return row["prompt"]

    def ratio_reward(completions1, completions2):
        return [min(len(a), len(b)) / max(len(a), len(b), 1) for a, b in zip(completions1, completions2, strict=True)]

    trainer = MAGRPOTrainer(
        agent_model=tiny_model_dir, num_agents=2, tokenizer=tokenizer, model_config={"torch_dtype": "float32"},
        train_dataset=Dataset.from_dict({"prompt": SEED_PROMPTS}), eval_dataset=Dataset.from_dict({"prompt": SEED_PROMPTS}),
        reward_func=ratio_reward, reward_processor=lambda r: 2.0 * r + 1.0, formatters=formatter,
        external_transition=length_feedback, args=comlrl_config(tmp_path),
    )  # fmt: skip
    assert trainer.num_agents == 2 and len(trainer.task.formatters) == 2
    assert len(trainer.eval_dataset) == 4  # kept whole: each evaluation takes its first eval_num_samples=2 rows
    trainer.train()
    logs = [h for h in trainer.state.log_history if "turn_1/reward_mean" in h]
    evals = [h for h in trainer.state.log_history if "eval_turn_1/reward_mean" in h]
    # one prompt per step, as CoMLRL: 4 steps; eval_interval=4 evaluates before the first (eval_on_start) and after 4
    assert len(logs) == 4 and len(evals) == 2
    log = logs[0]
    for turn in (1, 2):  # the processor applies to every value: the ratio in [0, 1] becomes 2 * ratio + 1 in [1, 3]
        assert 1.0 <= log[f"turn_{turn}/reward_mean"] <= 3.0
        assert log[f"turn_{turn}/reward_mean"] == pytest.approx(log[f"turn_{turn}/rewards/ratio_reward/mean"])
    assert set(seen) <= set(SEED_PROMPTS) and seen


def test_trainer_arguments_without_equivalent_are_refused_before_loading(tmp_path, tokenizer):
    args = comlrl_config(tmp_path)
    data = Dataset.from_dict({"prompt": SEED_PROMPTS})
    common = dict(agent_model="/no/such/model", tokenizer=tokenizer, train_dataset=data, args=args)
    with pytest.raises(ValueError, match="MAGRPOTrainer: eval_logger is given alone; CoMLRL calls eval_logger and"):
        MAGRPOTrainer(**common, reward_func=lambda a, b: [0.0] * len(a), eval_logger=lambda **kw: {})
    with pytest.raises(ValueError, match=r"model_config keys \['quantize'\]"):
        MAGRPOTrainer(**common, reward_func=lambda a, b: [0.0] * len(a), model_config={"quantize": True})
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'rolout_buffer'"):
        MAGRPOTrainer(**common, reward_func=lambda a, b: [0.0] * len(a), rolout_buffer=2)
    # As in CoMLRL, the trainer's team size wins over the config's num_agents (which CoMLRL reads for its reference
    # devices only): three agents are built, and the missing folder is named.
    with pytest.raises(FileNotFoundError, match=r"model\[0\] = '/no/such/a' could not be loaded"):
        MAGRPOTrainer(
            agents=["/no/such/a", "/no/such/b", "/no/such/c"], tokenizer=tokenizer, train_dataset=data, args=args,
            reward_func=lambda a, b, c: [0.0] * len(a),
        )  # fmt: skip


def test_wandb_config_reaches_a_real_wandb_run(tmp_path, tokenizer, tiny_model_dir, monkeypatch):
    pytest.importorskip("wandb")
    for variable in ("WANDB_PROJECT", "WANDB_DIR", "WANDB_MODE", "WANDB_TAGS"):
        monkeypatch.setenv(variable, "")  # restored (unset) after the test, whatever the trainer sets
        monkeypatch.delenv(variable)
    args = comlrl_config(tmp_path, num_turns=1, eval_interval=0, max_steps=1)
    trainer = MAGRPOTrainer(
        agent_model=tiny_model_dir, tokenizer=tokenizer, train_dataset=Dataset.from_dict({"prompt": SEED_PROMPTS}),
        reward_func=lambda a, b: [float(len(x)) for x in a], args=args,
        wandb_config={"project": "comlrl-dropin", "name": "run-a", "mode": "offline", "dir": str(tmp_path), "tags": ["t"]},
    )  # fmt: skip
    assert "wandb" in trainer.args.report_to and trainer.args.run_name == "run-a"
    assert "wandb" not in args.report_to and args.run_name != "run-a"  # the caller's config is left as it was
    import wandb

    try:  # the run CoMLRL opens when built, with wandb_config's settings (the environment left as it was)
        assert "WANDB_PROJECT" not in os.environ and "WANDB_TAGS" not in os.environ
        assert wandb.run.project == "comlrl-dropin" and list(wandb.run.tags) == ["t"]
        trainer.train()
    finally:
        wandb.finish()
    runs = glob.glob(os.path.join(str(tmp_path), "wandb", "offline-run-*"))
    assert len(runs) == 1
    assert any(f.endswith(".wandb") for f in os.listdir(runs[0]))


@pytest.mark.parametrize("passthrough", [False, True])
def test_formatters_with_external_prompts_format_later_turns_unless_passthrough(
    tmp_path, tokenizer, tiny_model_dir, passthrough
):
    """CoMLRL's multi-turn formatters take `external_prompts`: without passthrough (CoMLRL's default) each later
    turn's prompt is `formatter(row with the transition's prompt, external_prompts=it)`; with it, the transition's."""
    calls = []

    def formatter(row, external_prompts=None):
        calls.append(external_prompts)
        return row["prompt"] if external_prompts is None else f"[{row['source']}] {external_prompts}"

    args = comlrl_config(
        tmp_path,
        external_prompt_passthrough=passthrough,
        eval_interval=0,
        max_steps=1,
        early_termination_threshold=None,
    )
    trainer = MAGRPOTrainer(
        agent_model=tiny_model_dir, tokenizer=tokenizer, formatters=formatter, external_transition=length_feedback,
        train_dataset=Dataset.from_dict({"prompt": SEED_PROMPTS, "source": ["seed"] * len(SEED_PROMPTS)}),
        reward_func=lambda prompts, a, b: [float(str(prompts[0]).startswith("[seed]"))], args=args,  # CoMLRL's call
    )  # fmt: skip
    trainer.train()
    log = trainer.state.log_history[0]
    assert log["turn_1/reward_mean"] == 0.0  # first-turn prompts: the row's own
    assert log["turn_2/reward_mean"] == (0.0 if passthrough else 1.0)
    later = [c for c in calls if c is not None]
    assert (len(later) == 0) if passthrough else (len(later) > 0 and all("Your last answer had" in c for c in later))


def test_a_script_that_keeps_only_the_signature_keys_keeps_its_learning_rate_and_evaluation(tmp_path, tiny_model_dir):
    """The companion scripts' `inspect.signature(MAGRPOConfig.__init__)` filter: every CoMLRL key survives it, the
    learning rate takes effect in the optimizer, and evaluation runs."""
    import inspect

    candidate = dict(
        output_dir=str(tmp_path / "run"), num_turns=1, num_train_epochs=1, agent_learning_rate=1e-5, logging_steps=1,
        num_generations=2, max_new_tokens=4, num_agents=2, parallel_training="none", agent_devices="cpu",
        rollout_buffer_size=2, train_batch_size=1, advantage_normalization=True, eval_interval=2, eval_num_samples=2,
        eval_batch_size=1, external_prompt_passthrough=False, report_to="none", save_strategy="no",
    )  # fmt: skip
    params = set(inspect.signature(MAGRPOConfig.__init__).parameters) - {"self", "args", "kwargs"}
    assert set(candidate) <= params
    config = MAGRPOConfig(**{k: v for k, v in candidate.items() if k in params})
    # two prompts per generation (one-node trees), one per optimizer step, as CoMLRL's buffer of 2 and batch of 1
    assert (config.per_device_train_batch_size, config.steps_per_generation) == (2, 2)
    data = Dataset.from_dict({"prompt": SEED_PROMPTS})
    trainer = MAGRPOTrainer(
        agent_model=tiny_model_dir, train_dataset=data, eval_dataset=data, args=config,
        reward_func=lambda a, b: [float(len(x) - len(y)) for x, y in zip(a, b, strict=True)],
    )  # fmt: skip
    trainer.train()
    assert set(trainer.lr_scheduler.base_lrs) == {1e-5}  # every parameter group
    assert trainer.state.global_step == 4  # 4 prompts, one per step
    assert any("eval_turn_1/reward_mean" in h for h in trainer.state.log_history)


def test_a_dataclass_subclass_keeps_the_comlrl_names(tmp_path):
    import dataclasses
    import inspect

    @dataclasses.dataclass
    class MyConfig(MAGRPOConfig):
        my_field: int = 3

    assert {"agent_learning_rate", "rollout_buffer_size", "eval_interval"} <= set(
        inspect.signature(MyConfig.__init__).parameters
    )
    config = MyConfig(output_dir=str(tmp_path), agent_learning_rate=2e-5, advantage_mode="raw", report_to="none")
    assert config.learning_rate == 2e-5 and config.agent_learning_rate == 2e-5 and config.my_field == 3
    assert config.advantage_baseline == "none" and config.advantage_mode == "raw"


@pytest.mark.parametrize(
    "field, value",
    [("parallel_training", "null"), ("parallel_training", None), ("agent_devices", "cpu"),
     ("agent_devices", ["cpu", "cpu"]), ("reference_devices", "auto")],
)  # fmt: skip
def test_device_settings_that_name_this_process_device_are_accepted_and_said(tmp_path, field, value, caplog):
    import trl_multiagent.comlrl.config as comlrl_module

    comlrl_module.logger.info_once.cache_clear()
    with caplog.at_level("INFO", logger="trl_multiagent.comlrl.config"):
        config = comlrl_config(tmp_path, **{field: value})
    assert config.parallel_training == "none"
    if field != "parallel_training":
        assert getattr(config, field) == value
        assert f"{field}={value!r} (CoMLRL) names this process's device (cpu)" in caplog.text


def test_comlrl_mp_with_this_device_is_accepted(tmp_path):
    config = comlrl_config(tmp_path, parallel_training="mp", agent_devices="cpu")
    assert config.parallel_training == "mp" and config.agent_devices == "cpu"


def test_rollout_buffer_counts_tree_nodes(tmp_path):
    # two turns of K=2 aligned: a tree has 1 + 2 = 3 nodes per agent; a buffer of 6 nodes holds 2 prompts' trees
    config = comlrl_config(tmp_path, rollout_buffer_size=6, train_batch_size=3, eval_interval=0)
    assert (config.per_device_train_batch_size, config.gradient_accumulation_steps, config.steps_per_generation) == (
        2, 1, 2,
    )  # fmt: skip
    assert config.rollout_buffer_size == 6 and config.comlrl_batch_sizes["train_batch_size"] == 3
    with pytest.raises(ValueError, match=r"rollout_buffer_size=6 \(CoMLRL\) sets per_device_train_batch_size=4, but"):
        comlrl_config(tmp_path, rollout_buffer_size=6, per_device_train_batch_size=6)


def test_eval_logger_and_aggregator_are_called_as_comlrl_calls_them(tmp_path, tokenizer, tiny_model_dir):
    seen = []

    def eval_logger(agent_completions_turns, batch_items, prompts):
        seen.append((agent_completions_turns, batch_items, prompts))
        return [{"len": len(agent_completions_turns[1][i][-1])} for i in range(len(batch_items))]

    def eval_aggregator(metrics, num_turns):
        return {f"turn_{num_turns}/agent_1_length": sum(m["len"] for m in metrics) / len(metrics)}

    data = Dataset.from_dict({"prompt": SEED_PROMPTS})
    trainer = MAGRPOTrainer(
        agent_model=tiny_model_dir, tokenizer=tokenizer, train_dataset=data, eval_dataset=data,
        reward_func=lambda a, b: [0.0] * len(a), external_transition=length_feedback, eval_logger=eval_logger,
        eval_aggregator=eval_aggregator, args=comlrl_config(tmp_path, max_steps=1),
    )  # fmt: skip
    trainer.train()
    completions, rows, prompts = seen[0]
    assert len(completions) == 2 and len(completions[0]) == len(rows) == len(prompts)
    assert all(len(path) == 2 and all(isinstance(t, str) for t in path) for path in completions[0])  # two turns
    assert prompts == [r["prompt"] for r in rows]
    logged = [h["eval_turn_2/agent_1_length"] for h in trainer.state.log_history if "eval_turn_2/agent_1_length" in h]
    assert len(logged) == 2 and all(0 <= v for v in logged)  # before the step (eval_on_start) and after it


def test_model_config_special_tokens_are_added_and_every_agent_resized(tmp_path, tiny_model_dir):
    from trl_multiagent.demo.testing import make_tokenizer

    tokenizer = make_tokenizer()
    trainer = MAGRPOTrainer(
        agent_model=tiny_model_dir, tokenizer=tokenizer, train_dataset=Dataset.from_dict({"prompt": SEED_PROMPTS}),
        reward_func=lambda a, b: [0.0] * len(a), external_transition=length_feedback, args=comlrl_config(tmp_path),
        model_config={"special_tokens": {"additional_special_tokens": ["<plan>", "<code>"]}, "torch_dtype": "float32"},
    )  # fmt: skip
    assert tokenizer.convert_tokens_to_ids("<code>") == 401
    for i in range(2):
        assert trainer.team.agent(i).get_input_embeddings().weight.shape[0] == 402


def test_wandb_config_opens_the_run_when_built_as_comlrl_and_leaves_the_environment(
    tmp_path, tokenizer, tiny_model_dir, monkeypatch
):
    import wandb

    for variable in [name for name in os.environ if name.startswith("WANDB_")]:
        monkeypatch.delenv(variable)
    wandb_config = {"project": "p", "entity": None, "name": "n", "dir": str(tmp_path), "mode": "offline", "id": "r1",
                    "tags": ["a", "b"], "config_sections": {"dataset": {"name": "tldr", "type": "tldr"},
                                                            "output": {"verbose": False}}}  # fmt: skip
    try:
        trainer = MAGRPOTrainer(
            agent_model=tiny_model_dir, tokenizer=tokenizer, train_dataset=Dataset.from_dict({"prompt": SEED_PROMPTS}),
            reward_func=lambda a, b: [0.0] * len(a), external_transition=length_feedback, dataset_type="tldr",
            args=comlrl_config(tmp_path), wandb_config=wandb_config,
        )  # fmt: skip
        # CoMLRL opens the run in its trainer's constructor; its settings reach wandb.init, not the environment (wandb
        # notes its own service there, WANDB_SERVICE, as for any run)
        assert [name for name in os.environ if name.startswith("WANDB_") and name != "WANDB_SERVICE"] == []
        run = wandb.run
        assert (run.id, run.name, run.project, list(run.tags)) == ("r1", "n", "p", ["a", "b"])
        assert run.settings.mode == "offline" and str(tmp_path) in run.settings.wandb_dir
        assert run.config["dataset_name"] == "tldr" and run.config["dataset_type"] == "tldr"
        assert trainer.args.disable_tqdm and trainer.args.run_name == "n" and trainer.args.report_to == ["wandb"]
    finally:
        wandb.finish()


def test_agent_model_beside_agents_naming_the_same_model_is_accepted(tmp_path, tokenizer, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    agents = [AutoModelForCausalLM.from_pretrained(tiny_model_dir) for _ in range(2)]
    common = dict(
        tokenizer=tokenizer, train_dataset=Dataset.from_dict({"prompt": SEED_PROMPTS}), args=comlrl_config(tmp_path),
        reward_func=lambda a, b: [0.0] * len(a), external_transition=length_feedback,
    )  # fmt: skip
    trainer = MAGRPOTrainer(agent_model=tiny_model_dir, agents=agents, **common)
    assert trainer.team.agent(0) is agents[0] and trainer.num_agents == 2
    with pytest.raises(ValueError, match=r"agent_model='/other' conflicts with agents\[0\]"):
        MAGRPOTrainer(agent_model="/other", agents=agents, **common)


def test_agent_learning_rate_is_constant_as_in_comlrl(tmp_path):
    assert comlrl_config(tmp_path).lr_scheduler_type == "constant"
    assert comlrl_config(tmp_path, lr_scheduler_type="cosine").lr_scheduler_type == "cosine"


def test_comlrl_names_set_after_construction_take_effect_or_raise_by_name(tmp_path, tokenizer, tiny_model_dir):
    config = comlrl_config(tmp_path)
    config.agent_learning_rate = 3e-5  # as on CoMLRL's config: the trainer trains at it
    config.advantage_mode = "raw"
    common = dict(
        agent_model=tiny_model_dir, tokenizer=tokenizer, train_dataset=Dataset.from_dict({"prompt": SEED_PROMPTS}),
        reward_func=lambda a, b: [0.0] * len(a), external_transition=length_feedback,
    )  # fmt: skip
    trainer = MAGRPOTrainer(**common, args=config)
    assert (trainer.args.learning_rate, trainer.args.advantage_baseline) == (3e-5, "none")
    assert config.learning_rate == 1e-3  # the caller's config is left as it was
    config.rollout_buffer_size = 4
    with pytest.raises(ValueError, match=r"\['rollout_buffer_size'\] \(CoMLRL\) set after the config was built"):
        MAGRPOTrainer(**common, args=config)
    with pytest.raises(AttributeError, match=r"train_batch_size \(CoMLRL\) is given to the constructor"):
        config.train_batch_size = 4


def test_building_a_config_leaves_the_process_environment_unchanged(tmp_path):
    """Every setting a config is given stays in the config: W&B's are applied by the trainer when a run starts
    (`test_wandb_config_reaches_a_real_wandb_run`), never written to `os.environ` by `MAGRPOConfig(...)`."""
    comlrl_config(tmp_path)  # the first build imports what it needs (an import may set its own variables)
    before = dict(os.environ)
    comlrl_config(tmp_path, report_to="wandb", run_name="run-a", rollout_buffer_size=2, agent_devices="cpu")
    MAGRPOConfig(str(tmp_path), num_generations=2, per_device_train_batch_size=2, report_to="none")
    assert dict(os.environ) == before


def test_the_config_holds_no_comlrl_class_and_keeps_its_names_through_copies(tmp_path):
    import copy
    import dataclasses
    import inspect
    import pickle

    import trl_multiagent

    assert type(MAGRPOConfig) is type and type(trl_multiagent.MAGRPOConfig) is type  # no metaclass
    assert not any("comlrl" in cls.__module__ for cls in trl_multiagent.MAGRPOConfig.__mro__)
    config = comlrl_config(tmp_path, rollout_buffer_size=6, train_batch_size=3, eval_interval=0)
    assert {"agent_learning_rate", "rollout_buffer_size"} <= {f.name for f in dataclasses.fields(config)}
    assert config.to_dict()["rollout_buffer_size"] == 6 and config.to_dict()["learning_rate"] == 1e-3
    for copied in (copy.deepcopy(config), pickle.loads(pickle.dumps(config)), copy.copy(config)):
        assert copied == config and copied.rollout_buffer_size == 6
        assert copied.comlrl_batch_sizes["train_batch_size"] == 3
        assert copied.external_prompt_passthrough and copied.advantage_mode == "rloo"
    for cls in (MAGRPOConfig, trl_multiagent.MAGRPOConfig):
        assert list(inspect.signature(cls).parameters) == list(inspect.signature(cls.__init__).parameters)[1:]
    assert "agent_learning_rate" in inspect.signature(MAGRPOConfig).parameters
    assert "agent_learning_rate" not in inspect.signature(trl_multiagent.MAGRPOConfig).parameters
    assert not hasattr(config, "no_such_name")


def test_a_reward_processor_returning_nan_is_named_by_its_keyword(tmp_path, tokenizer, tiny_model_dir):
    """CoMLRL's `reward_processor` applies to each value of the reward; a bad value names it."""

    def halve_badly(value):
        return float("nan")

    trainer = MAGRPOTrainer(
        agent_model=tiny_model_dir, tokenizer=tokenizer, train_dataset=Dataset.from_dict({"prompt": SEED_PROMPTS}),
        reward_func=lambda a, b: [0.0] * len(a), reward_processor=halve_badly, args=comlrl_config(tmp_path),
        external_transition=length_feedback,
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"reward_processor 'halve_badly' returned nan for the value 0.0 of reward"):
        trainer.train()  # at its first call, as CoMLRL calls it (nothing is called when the trainer is built)
    assert trainer.state.global_step == 0


@pytest.mark.parametrize("num_generations", [1, None])
def test_comlrl_names_with_a_bad_num_generations_get_the_configs_own_error(tmp_path, num_generations):
    # CoMLRL's names count prompts in groups of num_generations: they are left untranslated, and the config names K
    with pytest.raises(ValueError, match=f"num_generations must be >= 2, got {num_generations}"):
        comlrl_config(tmp_path, num_generations=num_generations, rollout_buffer_size=4)


def test_comlrls_batch_items_reach_a_reward_by_name_or_through_kwargs():
    """The core passes each joint action's row as `rows`; the face gives it to CoMLRL's rewards as `batch_items`."""
    from trl_multiagent.comlrl.rewards import comlrl_reward
    from trl_multiagent.rewards.joint import JointReward

    seen = []

    def by_name(completions1, completions2, *, batch_items):  # keyword-only: CoMLRL passes it by name
        seen.append(("by_name", batch_items))
        return [0.0] * len(completions1)

    def through_kwargs(completions1, completions2, **kwargs):
        seen.append(("through_kwargs", kwargs["batch_items"]))
        return [0.0] * len(completions1)

    class Scorer:  # a callable object keeps its class's name
        def __call__(self, completions1, completions2, **kwargs):
            seen.append(("Scorer", kwargs["batch_items"]))
            return [0.0] * len(completions1)

    rows = [{"prompt": "p", "target": 3}]
    reward = JointReward([comlrl_reward(f, 2, None) for f in (by_name, through_kwargs, Scorer())], None, num_agents=2)
    reward([["a"], ["b"]], 1, {"rows": rows, "prompts": [["p"], ["p"]]})
    assert seen == [("by_name", rows), ("through_kwargs", rows), ("Scorer", rows)]
    assert reward.names == ["by_name", "through_kwargs", "Scorer"]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(eval_batch_size=0), r"MAGRPOConfig: eval_batch_size \(CoMLRL\) must be >= 1, got 0"),
        (dict(eval_interval=-1), r"MAGRPOConfig: eval_interval \(CoMLRL\) must be >= 0, got -1"),
        (dict(eval_num_samples=-1), r"MAGRPOConfig: eval_num_samples \(CoMLRL\) must be >= 0, got -1"),
        (dict(reference_kl_coef=-0.1), r"MAGRPOConfig: reference_kl_coef \(CoMLRL\) must be >= 0, got -0.1"),
        (dict(rollout_buffer_size=0), r"MAGRPOConfig: rollout_buffer_size \(CoMLRL\) must be >= 1, got 0"),
        (dict(parallel_training="ddp"), r"MAGRPOConfig: parallel_training='ddp' \(CoMLRL\) must be one of"),
        (dict(joint_mode="diagonal"), r"MAGRPOConfig: joint_mode='diagonal' must be one of \['align', 'aligned'"),
    ],
)
def test_comlrls_own_refusals(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MAGRPOConfig(report_to="none", **kwargs)


@pytest.mark.parametrize(
    "spelling, mode", [("align", "aligned"), ("ALIGNED", "aligned"), ("Cross", "cross"), ("crossed", "cross")]
)
def test_joint_mode_takes_comlrls_spellings(spelling, mode):
    assert MAGRPOConfig(report_to="none", joint_mode=spelling).joint_mode == mode


def test_defaults_are_comlrls_here_and_trls_in_the_trl_face():
    import trl

    import trl_multiagent

    comlrl, trl_face, grpo = (
        MAGRPOConfig(report_to="none"),
        trl_multiagent.MAGRPOConfig(report_to="none"),
        trl.GRPOConfig(use_cpu=True, bf16=False, report_to="none"),
    )
    assert (comlrl.num_turns, comlrl.early_termination_threshold, comlrl.learning_rate) == (2, -0.2, 5e-6)
    assert (comlrl.temperature, comlrl.top_p, comlrl.top_k, comlrl.max_completion_length) == (0.6, 0.6, 50, 256)
    assert (comlrl.num_train_epochs, comlrl.logging_steps, comlrl.num_agents) == (20, 50, 2)
    assert (trl_face.num_turns, trl_face.early_termination_threshold, trl_face.num_agents) == (1, None, None)
    for name in (
        "temperature",
        "top_p",
        "top_k",
        "learning_rate",
        "num_train_epochs",
        "logging_steps",
        "max_completion_length",
        "num_generations",
        "beta",
        "scale_rewards",
        "lr_scheduler_type",
    ):
        assert getattr(trl_face, name) == getattr(grpo, name), name


@pytest.mark.parametrize(
    "name, trl_name",
    [("agent_learning_rate", "`learning_rate`"), ("rollout_buffer_size", "`per_device_train_batch_size`"),
     ("advantage_mode", "`advantage_baseline`")],
)  # fmt: skip
def test_a_comlrl_config_name_in_the_trl_face_gives_trls_name_and_the_comlrl_face(name, trl_name):
    import trl_multiagent

    with pytest.raises(TypeError, match="unexpected keyword argument") as raised:
        trl_multiagent.MAGRPOConfig(report_to="none", **{name: 1})
    message = str(raised.value)
    assert f"{name!r}: it is CoMLRL's name; TRL's is {trl_name}" in message
    assert "from trl_multiagent.comlrl import MAGRPOConfig, MAGRPOTrainer" in message


@pytest.mark.parametrize(
    "name, trl_name",
    [("agents", "`model=[model_a, model_b]`"), ("tokenizer", "`processing_class`"), ("reward_func", "`reward_funcs`")],
)
def test_a_comlrl_trainer_name_in_the_trl_face_gives_trls_name_and_the_comlrl_face(name, trl_name, tokenizer):
    import trl_multiagent

    with pytest.raises(TypeError) as raised:
        trl_multiagent.MAGRPOTrainer(model="/no/such/model", **{name: 1})
    assert (
        f"MAGRPOTrainer.__init__() got an unexpected keyword argument {name!r}: it is CoMLRL's name; TRL's is {trl_name}"
        in str(raised.value)
    )
    assert "from trl_multiagent.comlrl import MAGRPOConfig, MAGRPOTrainer" in str(raised.value)


def test_a_misspelled_trainer_argument_names_the_closest_ones():
    import trl_multiagent

    with pytest.raises(TypeError) as raised:
        trl_multiagent.MAGRPOTrainer(model="/no/such/model", num_agent=2)
    assert str(raised.value) == (
        "MAGRPOTrainer.__init__() got an unexpected keyword argument 'num_agent'. Closest names: 'num_agents' "
        "(MAGRPOTrainer's). Every argument: docs/configuration.md."
    )
