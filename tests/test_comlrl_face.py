"""CoMLRL 1.4.3's public behaviour in the CoMLRL face (`trl_multiagent.comlrl`), beyond the contract harness
(tests/comlrl_contract): a trainer built without `train_dataset`, any sequence of rows as a dataset, a one-row dataset
trained one prompt per step, `joint_mode`'s spellings, `reference_devices`' length, CoMLRL's public attributes."""

import pytest
import torch
from datasets import Dataset

from trl_multiagent.comlrl import MAGRPOConfig, MAGRPOTrainer
from trl_multiagent.demo.testing import make_model


def config(tmp_path, **overrides):
    values = dict(
        output_dir=str(tmp_path / "run"), num_agents=2, num_turns=1, num_generations=2, max_new_tokens=4,
        num_train_epochs=1, logging_steps=1, eval_interval=0, early_termination_threshold=None, report_to="none",
        seed=0, agent_learning_rate=1e-2,
    )  # fmt: skip
    values.update(overrides)
    return MAGRPOConfig(**values)


def joint_score(completions1, completions2):
    """Differs between a prompt's answers (the tiny models' answers all have max_new_tokens tokens)."""
    return [float(sum(map(ord, a + b)) % 7) for a, b in zip(completions1, completions2, strict=True)]


def team(tokenizer, **overrides):
    arguments = dict(agents=[make_model(tokenizer, seed=0), make_model(tokenizer, seed=1)], tokenizer=tokenizer)
    return {**arguments, "reward_func": joint_score, **overrides}


def test_built_without_train_dataset_then_refuses_to_train_until_one_is_set(tmp_path, tokenizer):
    trainer = MAGRPOTrainer(**team(tokenizer), args=config(tmp_path))
    before = [p.detach().clone() for p in trainer.agents[0].parameters()]
    with pytest.raises(ValueError, match="MAGRPOTrainer.train: no train_dataset"):
        trainer.train()
    assert trainer.state.global_step == 0
    trainer.train_dataset = [{"prompt": "count to three"}, {"prompt": "name a colour"}]  # CoMLRL: any sequence
    trainer.train()
    assert trainer.state.global_step == 1 and isinstance(trainer.train_dataset, Dataset)  # read as rows of a Dataset
    assert trainer.optimizers == [trainer.optimizer] and trainer.optimizer is not None  # made by train()
    assert any(not torch.equal(b, p) for b, p in zip(before, trainer.agents[0].parameters(), strict=True))


def test_a_list_of_dicts_is_a_dataset(tmp_path, tokenizer):
    rows = [{"prompt": "count to three"}, {"prompt": "name a colour"}]
    trainer = MAGRPOTrainer(**team(tokenizer), train_dataset=rows, args=config(tmp_path))
    assert isinstance(trainer.train_dataset, Dataset) and trainer.train_dataset["prompt"] == [
        r["prompt"] for r in rows
    ]


def test_a_one_row_dataset_trains_one_prompt_per_step(tmp_path, tokenizer):
    """CoMLRL's defaults take 2 prompts per generation (rollout_buffer_size=2); one row still trains, a prompt a step."""
    args = config(tmp_path, num_train_epochs=3)
    assert args.generation_batch_size == 4  # 2 prompts x 2 generations, for a dataset that has them
    trainer = MAGRPOTrainer(**team(tokenizer), train_dataset=[{"prompt": "count to three"}], args=args)
    assert (trainer.args.per_device_train_batch_size, trainer.args.generation_batch_size) == (2, 2)
    assert args.generation_batch_size == 4  # the caller's config is not changed
    trainer.train()
    assert trainer.state.global_step == 3  # one prompt, three epochs
    assert trainer.env_step == 3 * 2  # CoMLRL's counter: joint actions scored (2 generations, aligned, per prompt)


@pytest.mark.parametrize("spelling", ["align", "Aligned", "CROSS", "crossed"])
def test_joint_mode_spellings(tmp_path, spelling):
    expected = "cross" if spelling.lower().startswith("cross") else "aligned"
    assert config(tmp_path, joint_mode=spelling).joint_mode == expected


def test_joint_mode_is_ignored_with_one_agent_and_refused_with_two(tmp_path):
    assert config(tmp_path, num_agents=1, joint_mode="unknown").joint_mode == "aligned"
    with pytest.raises(ValueError, match="joint_mode='unknown' must be one of"):
        config(tmp_path, joint_mode="unknown")


def test_reference_devices_length_is_one_or_one_per_agent(tmp_path):
    with pytest.raises(ValueError, match=r"reference_devices length \(3\) must be 1 or num_agents \(2\)"):
        config(tmp_path, reference_kl_enabled=True, reference_devices=["cpu"] * 3)
    config(tmp_path, reference_kl_enabled=True, reference_devices=["cpu", "cpu"])
    config(tmp_path, reference_kl_enabled=True, reference_devices=["cpu"])
    config(tmp_path, reference_kl_enabled=False, reference_devices=["cpu"] * 3)  # not placed without the KL term


def test_num_turns_below_one_is_refused_naming_it(tmp_path):
    with pytest.raises(ValueError, match="num_turns must be >= 1, got 0"):
        config(tmp_path, num_turns=0)


def test_each_rule_runs_once_when_the_config_is_built(tmp_path, monkeypatch):
    """CoMLRL's values are checked once when the config is built (`check_comlrl_values`; again only when a trainer is
    built, for a name set since), and so are the TRL face's rules (`num_generations`, before GRPOConfig's own)."""
    from trl_multiagent import config as trl_face
    from trl_multiagent.comlrl import config as comlrl_face

    calls, check, rule = [], comlrl_face.check_comlrl_values, trl_face.MAGRPOConfig._check_num_generations
    monkeypatch.setattr(comlrl_face, "check_comlrl_values", lambda c: calls.append("CoMLRL's") or check(c))
    monkeypatch.setattr(trl_face.MAGRPOConfig, "_check_num_generations", lambda c: calls.append("K") or rule(c))
    config(tmp_path)
    assert calls == ["CoMLRL's", "K"]


def test_refusals_in_comlrl_words(tmp_path, tokenizer):
    with pytest.raises(ValueError, match="Either agent_model or agents"):
        MAGRPOTrainer(reward_func=joint_score, args=config(tmp_path))
    with pytest.raises(ValueError, match="external_transition"):
        MAGRPOTrainer(**team(tokenizer), args=config(tmp_path, num_turns=2))


def test_comlrl_public_attributes(tmp_path, tokenizer, tiny_model_dir):
    def processor(reward):
        return 2 * reward

    def formatter(row):
        return row["prompt"]

    agents = [make_model(tokenizer, seed=0), make_model(tokenizer, seed=1)]
    wandb_config = {"project": "p", "mode": "disabled"}
    trainer = MAGRPOTrainer(
        agents=agents, tokenizer=tokenizer, reward_func=joint_score, reward_processor=processor, formatters=formatter,
        train_dataset=[{"prompt": "count to three"}] * 2, model_config={"dtype": "float32"},
        args=config(tmp_path, reference_kl_enabled=True), wandb_config=wandb_config,
    )  # fmt: skip
    assert [a is b for a, b in zip(trainer.agents, agents, strict=True)] == [True, True]
    assert trainer.tokenizer is tokenizer and trainer.tokenizers == [tokenizer, tokenizer]
    assert trainer.reward_func is joint_score and trainer.reward_processor is processor
    assert trainer.formatters == [formatter, formatter]
    assert trainer.model_config == {"dtype": "float32"} and trainer.wandb_config == wandb_config
    assert trainer.agent_devices == [torch.device("cpu")] * 2 and trainer.env_step == 0
    assert trainer.model_name == "llama"  # in memory, no path: its model_type, as CoMLRL names it
    references = trainer.reference_models  # frozen copies, with the agents' weights
    assert len(references) == 2 and all(r is not a for r, a in zip(references, agents, strict=True))
    for reference, agent in zip(references, agents, strict=True):
        assert not any(p.requires_grad for p in reference.parameters())
        for (name, r), (_, a) in zip(reference.named_parameters(), agent.named_parameters(), strict=True):
            assert torch.equal(r, a), name
    assert trainer.optimizers == []  # made by train(), as the Trainer makes it
    by_id = MAGRPOTrainer(
        agent_model=tiny_model_dir, tokenizer=tokenizer, reward_func=joint_score, args=config(tmp_path)
    )
    assert by_id.model_name == tiny_model_dir and len(by_id.agents) == 2
    assert by_id.reward_processor(1.5) == 1.5  # CoMLRL's identity when none is given
    assert by_id.reference_models == []  # no KL term
    with pytest.raises(AttributeError):
        by_id.reward_func = processor  # CoMLRL's trainer would use it; here it is fixed when built: refused


def weights(trainer) -> list[dict]:
    return [{k: v.detach().clone() for k, v in agent.state_dict().items()} for agent in trainer.agents]


def assert_same_weights(left, right):
    for a, b in zip(left, right, strict=True):
        for name in a:
            assert torch.equal(a[name], b[name]), name


def one_row_trainer(tmp_path, tokenizer, epochs, seed=0):
    agents = [make_model(tokenizer, seed=seed), make_model(tokenizer, seed=seed + 1)]
    return MAGRPOTrainer(
        agents=agents, tokenizer=tokenizer, reward_func=joint_score, train_dataset=[{"prompt": "count to three"}],
        args=config(tmp_path, num_train_epochs=epochs),
    )  # fmt: skip


def test_train_checkpoint_dir_saves_every_interval_epochs_and_the_last(tmp_path, tokenizer):
    trainer = one_row_trainer(tmp_path, tokenizer, epochs=3)  # one step per epoch
    trainer.train(checkpoint_dir=tmp_path / "every2", checkpoint_interval=2)
    assert sorted(p.name for p in (tmp_path / "every2").glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-3"]
    assert trainer.args.output_dir == str(tmp_path / "run")  # the run's own settings come back
    limited = one_row_trainer(tmp_path, tokenizer, epochs=3)
    limited.train(checkpoint_dir=tmp_path / "newest", checkpoint_total_limit=1)
    assert [p.name for p in (tmp_path / "newest").glob("checkpoint-*")] == ["checkpoint-3"]


@pytest.mark.parametrize("interval", [0, -1, True, 1.5, "1"])
def test_checkpoint_interval_is_a_positive_integer(tmp_path, tokenizer, interval):
    trainer = one_row_trainer(tmp_path, tokenizer, epochs=1)
    with pytest.raises(ValueError, match="checkpoint_interval must be a positive integer"):
        trainer.train(checkpoint_dir=tmp_path / "c", checkpoint_interval=interval)
    with pytest.raises(ValueError, match="checkpoint_total_limit must be a positive integer or None"):
        trainer.train(checkpoint_dir=tmp_path / "c", checkpoint_total_limit=0)
    assert trainer.state.global_step == 0


def test_save_checkpoint_then_load_or_resume_it(tmp_path, tokenizer):
    continuous = one_row_trainer(tmp_path, tokenizer, epochs=2)
    continuous.train()
    first = one_row_trainer(tmp_path, tokenizer, epochs=1)
    first.train()
    saved = first.save_checkpoint(tmp_path / "saved")
    assert saved == str(tmp_path / "saved") and (tmp_path / "saved" / "agent_1").is_dir()

    loaded = one_row_trainer(tmp_path, tokenizer, epochs=2, seed=7)  # other weights
    assert loaded.load_checkpoint(saved) == {"epoch": 1.0, "global_step": 1}
    assert_same_weights(weights(loaded), weights(first))

    resumed = one_row_trainer(tmp_path, tokenizer, epochs=2, seed=7)
    resumed.train(resume_from_checkpoint=saved)
    assert resumed.state.global_step == 2
    assert_same_weights(weights(resumed), weights(continuous))  # optimizer, scheduler and RNG came back too

    (tmp_path / "not_a_checkpoint").mkdir()
    with pytest.raises(FileExistsError, match="not a checkpoint"):
        first.save_checkpoint(tmp_path / "not_a_checkpoint")
    with pytest.raises(FileNotFoundError, match="not a complete checkpoint"):
        loaded.load_checkpoint(tmp_path / "not_a_checkpoint")


def test_save_checkpoint_before_training_holds_the_weights(tmp_path, tokenizer):
    untrained = one_row_trainer(tmp_path, tokenizer, epochs=1, seed=3)
    saved = untrained.save_checkpoint(tmp_path / "pristine")
    other = one_row_trainer(tmp_path, tokenizer, epochs=1)
    assert other.load_checkpoint(saved)["global_step"] == 0
    assert_same_weights(weights(other), weights(untrained))
