"""CoMLRL 1.4.3's checkpoints in its face (comlrl/checkpoints.py): written only when asked, `checkpoint-{epochs}` under
one numbering rule that resume follows, CoMLRL's metadata read back by `read_checkpoint_metadata`, another run's
checkpoints left alone, and a resumed run equal to an uninterrupted one."""

import json
import re
import shutil

import pytest
import torch

from trl_multiagent.comlrl import MAGRPOConfig, MAGRPOTrainer
from trl_multiagent.comlrl.utils.checkpoint import read_checkpoint_metadata
from trl_multiagent.demo.testing import make_model


TWO_ROWS = [{"prompt": "count to three"}, {"prompt": "name a colour"}]  # one prompt per step: two steps per epoch


def joint_score(completions1, completions2):
    return [float(sum(map(ord, a + b)) % 7) for a, b in zip(completions1, completions2, strict=True)]


def trainer(tmp_path, tokenizer, epochs, seed=0, **overrides):
    values = dict(
        output_dir=str(tmp_path / "run"), num_turns=1, num_generations=2, max_new_tokens=4, num_train_epochs=epochs,
        logging_steps=1, eval_interval=0, rollout_buffer_size=1, report_to="none", seed=0, agent_learning_rate=1e-2,
    )  # fmt: skip
    values.update(overrides)
    return MAGRPOTrainer(
        agents=[make_model(tokenizer, seed=seed), make_model(tokenizer, seed=seed + 1)], tokenizer=tokenizer,
        reward_func=joint_score, train_dataset=TWO_ROWS, args=MAGRPOConfig(**values),
    )  # fmt: skip


def names(folder):
    return sorted(p.name for p in folder.glob("checkpoint-*"))


def weights(t) -> list[dict]:
    return [{k: v.detach().clone() for k, v in agent.state_dict().items()} for agent in t.agents]


def assert_same_weights(left, right):
    for a, b in zip(left, right, strict=True):
        for name in a:
            assert torch.equal(a[name], b[name]), name


def test_a_plain_train_writes_no_checkpoint(tmp_path, tokenizer):
    run = trainer(tmp_path, tokenizer, epochs=1)
    run.train()
    assert run.state.global_step == 2
    assert not (tmp_path / "run").exists() or names(tmp_path / "run") == []  # TRL would write checkpoint-2


def test_checkpoints_are_numbered_by_epoch_and_resuming_counts_on_to_the_uninterrupted_run(tmp_path, tokenizer):
    uninterrupted = trainer(tmp_path, tokenizer, epochs=4)
    uninterrupted.train()

    first = trainer(tmp_path, tokenizer, epochs=2)
    first.train(checkpoint_dir=tmp_path / "ckpt")
    assert names(tmp_path / "ckpt") == ["checkpoint-1", "checkpoint-2"]  # epochs, not steps (2 and 4)
    one, two = (read_checkpoint_metadata(tmp_path / "ckpt" / f"checkpoint-{n}") for n in (1, 2))
    assert re.fullmatch(r"[0-9a-f]{32}", one["run_id"])
    assert one == {
        "version": 1, "trainer_class": "trl_multiagent.comlrl.trainer.MAGRPOTrainer", "sequence": 1,
        "run_id": one["run_id"], "wandb": None,
    }  # fmt: skip
    assert two == {**one, "sequence": 2}
    steps = [
        json.loads((tmp_path / "ckpt" / n / "trainer_state.json").read_text())["global_step"]
        for n in names(tmp_path / "ckpt")
    ]
    assert steps == [2, 4]

    # `num_train_epochs` counts the whole run: 4 adds two epochs, numbered on
    resumed = trainer(tmp_path, tokenizer, epochs=4, seed=7)  # other weights: the checkpoint's replace them
    resumed.train(resume_from_checkpoint=str(tmp_path / "ckpt" / "checkpoint-2"), checkpoint_dir=tmp_path / "ckpt")
    assert names(tmp_path / "ckpt") == ["checkpoint-1", "checkpoint-2", "checkpoint-3", "checkpoint-4"]
    later = [read_checkpoint_metadata(tmp_path / "ckpt" / f"checkpoint-{n}") for n in (3, 4)]
    assert [m["sequence"] for m in later] == [3, 4] and {m["run_id"] for m in later} == {one["run_id"]}
    assert resumed.state.global_step == 8
    assert_same_weights(weights(resumed), weights(uninterrupted))

    # a run stopped after epoch 1, resumed there: it redoes epoch 2 over its own checkpoint-2, and ends the same
    again = trainer(tmp_path, tokenizer, epochs=4, seed=7)
    again.train(resume_from_checkpoint=str(tmp_path / "ckpt" / "checkpoint-1"), checkpoint_dir=tmp_path / "ckpt")
    assert read_checkpoint_metadata(tmp_path / "ckpt" / "checkpoint-2")["run_id"] == one["run_id"]
    assert_same_weights(weights(again), weights(uninterrupted))


def test_checkpoint_interval_and_total_limit_count_epochs(tmp_path, tokenizer):
    # TRL's saving arguments set too: within train(checkpoint_dir=...) CoMLRL's arguments alone decide
    every2 = trainer(tmp_path, tokenizer, epochs=3, save_strategy="steps", save_steps=1, save_total_limit=1)
    every2.train(checkpoint_dir=tmp_path / "every2", checkpoint_interval=2)
    assert names(tmp_path / "every2") == ["checkpoint-2", "checkpoint-3"]  # every second epoch, and the last
    assert names(tmp_path / "run") == []  # no step's checkpoint
    newest = trainer(tmp_path, tokenizer, epochs=3)
    newest.train(checkpoint_dir=tmp_path / "newest", checkpoint_total_limit=2)
    assert names(tmp_path / "newest") == ["checkpoint-2", "checkpoint-3"]
    # each checkpoint records the config as it was given, which training did not change
    saved = torch.load(tmp_path / "every2" / "checkpoint-3" / "training_args.bin", weights_only=False)
    for config in (saved, every2.args):
        assert (config.output_dir, config.save_strategy, config.save_steps, config.save_total_limit) == (
            str(tmp_path / "run"),
            "steps",
            1,
            1,
        )


def test_another_runs_checkpoints_are_never_replaced(tmp_path, tokenizer):
    first = trainer(tmp_path, tokenizer, epochs=2)
    first.train(checkpoint_dir=tmp_path / "ckpt")
    with pytest.raises(FileExistsError, match="checkpoint_dir already holds another run's checkpoint .*checkpoint-"):
        trainer(tmp_path, tokenizer, epochs=2).train(checkpoint_dir=tmp_path / "ckpt")
    # resuming at epoch 1 would replace checkpoint-2: refused once it belongs to another run
    metadata = tmp_path / "ckpt" / "checkpoint-2" / "comlrl_checkpoint.json"
    metadata.write_text(json.dumps({**json.loads(metadata.read_text()), "run_id": "0" * 32}))
    resumed = trainer(tmp_path, tokenizer, epochs=2)
    with pytest.raises(
        FileExistsError, match=r"refusing to replace .*checkpoint-2: it is not a checkpoint of this run"
    ):
        resumed.train(resume_from_checkpoint=str(tmp_path / "ckpt" / "checkpoint-1"), checkpoint_dir=tmp_path / "ckpt")
    assert resumed.state.global_step == 0


def test_save_checkpoint_and_read_checkpoint_metadata(tmp_path, tokenizer):
    run = trainer(tmp_path, tokenizer, epochs=1)
    pristine = read_checkpoint_metadata(run.save_checkpoint(tmp_path / "pristine"))
    # as CoMLRL's: no run identity before train() gets checkpoint arguments
    assert pristine == {
        "version": 1, "trainer_class": "trl_multiagent.comlrl.trainer.MAGRPOTrainer", "sequence": 0, "run_id": None,
        "wandb": None,
    }  # fmt: skip
    run.train()
    saved = run.save_checkpoint(tmp_path / "saved")
    assert read_checkpoint_metadata(saved) == {**pristine, "sequence": 1}  # one epoch on
    run.train(checkpoint_dir=tmp_path / "ckpt")  # a new run from step 0 (as CoMLRL without resume), identified
    metadata = read_checkpoint_metadata(run.save_checkpoint(saved))
    assert re.fullmatch(r"[0-9a-f]{32}", metadata["run_id"]) and metadata["sequence"] == 1

    loaded = trainer(tmp_path, tokenizer, epochs=1, seed=5)
    loaded.load_checkpoint(saved)  # its run identity comes with it
    assert read_checkpoint_metadata(loaded.save_checkpoint(tmp_path / "again"))["run_id"] == metadata["run_id"]
    assert read_checkpoint_metadata(tmp_path / "saved" / "comlrl_checkpoint.json") == metadata  # or its file

    with pytest.raises(FileNotFoundError, match=r"read_checkpoint_metadata: no comlrl_checkpoint.json in"):
        read_checkpoint_metadata(tmp_path)
    comlrl_own = tmp_path / "comlrl_own"
    comlrl_own.mkdir()
    (comlrl_own / "training_state.pt").write_bytes(b"")
    with pytest.raises(ValueError, match="is a checkpoint of CoMLRL itself"):
        read_checkpoint_metadata(comlrl_own)
    bad = tmp_path / "bad"
    shutil.copytree(saved, bad)
    for field, value, message in (
        ("version", 2, "unsupported checkpoint version 2"),
        ("sequence", -1, "invalid sequence -1"),
        ("run_id", "not-hex", "invalid run_id 'not-hex'"),
        ("wandb", {"id": ""}, "invalid W&B run identity"),
    ):
        (bad / "comlrl_checkpoint.json").write_text(json.dumps({**metadata, field: value}))
        with pytest.raises(ValueError, match=re.escape(message)):
            read_checkpoint_metadata(bad)
