"""Crash-safe checkpoints: a run SIGKILLed while writing a checkpoint resumes (`resume_from_checkpoint=True`) from the
newest complete one and ends bit for bit where an uninterrupted run ends.

Each run is tests/distributed/run_length_ratio.py in its own process (the tiny length-ratio task, a checkpoint every
step, 4 steps inside the first epoch).
"""

import os

import pytest
import torch
from test_distributed import assert_same, finished, launch

from trl_multiagent import checkpoint


STEPS = ("--max_steps", 4, "--save_steps", 1)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    _, (weights,) = finished(tmp_path_factory.mktemp("full"), *STEPS, nproc=1)
    return weights


# One kill point in the default suite; the other two in the slow stage, for time (docs/tests.md, "The default suite").
@pytest.mark.parametrize(
    "point",
    [
        pytest.param("between_agents", marks=pytest.mark.slow),
        pytest.param("before_optimizer", marks=pytest.mark.slow),
        "before_marker",
    ],
)
def test_killed_while_writing_a_checkpoint_resumes_from_the_last_complete_one(tmp_path, uninterrupted, point):
    killed, _ = launch(tmp_path, *STEPS, "--kill_at", 3, "--kill_point", point, nproc=1)
    assert killed.returncode == -9, killed.stderr[-3000:]  # SIGKILL, inside the checkpoint of step 3
    assert [os.path.basename(c) for c in checkpoint.checkpoints_by_step(str(tmp_path))] == [
        "checkpoint-3", "checkpoint-2", "checkpoint-1",
    ]  # fmt: skip
    assert not checkpoint.is_complete(str(tmp_path / "checkpoint-3"))
    assert checkpoint.is_complete(str(tmp_path / "checkpoint-2"))

    result, _ = launch(tmp_path, *STEPS, "--resume", "latest", nproc=1)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"skipping the incomplete checkpoint {tmp_path / 'checkpoint-3'}" in result.stderr
    resumed = torch.load(tmp_path / "weights_rank0.pt")
    assert_same(resumed, uninterrupted, rtol=0, atol=0)
    assert checkpoint.is_complete(str(tmp_path / "checkpoint-4"))


def test_an_incomplete_checkpoint_named_explicitly_is_refused(tmp_path):
    folder = tmp_path / "checkpoint-7"
    folder.mkdir()
    with pytest.raises(ValueError, match="checkpoint-7' is incomplete: it has no 'checkpoint_complete' marker"):
        checkpoint.resolve_resume(str(tmp_path), str(folder))
    with pytest.raises(ValueError, match="holds no complete checkpoint"):
        checkpoint.resolve_resume(str(tmp_path), True)
    checkpoint.mark_complete(str(folder))
    assert checkpoint.resolve_resume(str(tmp_path), True) == str(folder)


def test_resume_from_the_command_line_strings_and_a_missing_folder(tmp_path, monkeypatch):
    """`--resume_from_checkpoint true` arrives as a str; a folder that does not exist is named as such."""
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    (run / "checkpoint-2").mkdir(parents=True)
    checkpoint.mark_complete(str(run / "checkpoint-2"))
    assert checkpoint.resolve_resume(str(run), "true") == str(run / "checkpoint-2")
    assert checkpoint.resolve_resume(str(run), "True") == str(run / "checkpoint-2")
    assert checkpoint.resolve_resume(str(run), "false") is None
    with pytest.raises(FileNotFoundError, match=r"resume_from_checkpoint='run/checkpoint-3': no such folder"):
        checkpoint.resolve_resume(str(run), "run/checkpoint-3")
    (tmp_path / "true").mkdir()  # a folder of that name is a folder
    checkpoint.mark_complete(str(tmp_path / "true"))
    assert checkpoint.resolve_resume(str(run), "true") == "true"


# The resume mid-epoch in the default suite; the one at the epoch boundary in the slow stage, for time.
@pytest.mark.parametrize(
    "checkpoint_step", [pytest.param(4, marks=pytest.mark.slow), 5], ids=["epoch-boundary", "mid-epoch-2"]
)
def test_resume_with_shuffling_in_the_second_epoch_equals_an_uninterrupted_run(tmp_path, checkpoint_step):
    # 8 prompts, 2 per step: 4 steps per epoch; 6 steps end in the middle of epoch 2.
    steps = ("--max_steps", 6, "--save_steps", 1, "--shuffle")
    _, (full,) = finished(tmp_path / "full", *steps, nproc=1)
    resume = tmp_path / "full" / f"checkpoint-{checkpoint_step}"
    _, (resumed,) = finished(tmp_path / "resumed", *steps, "--resume", resume, nproc=1)
    assert_same(resumed, full, rtol=0, atol=0)


def test_rotation_never_deletes_the_last_complete_checkpoint_for_one_being_written(tmp_path, uninterrupted):
    # save_total_limit=1: the Trainer alone would delete checkpoint-2 as soon as checkpoint-3's files are written,
    # before the marker; here the rotation waits for the marker, so a kill just before it leaves checkpoint-2.
    killed, _ = launch(tmp_path, *STEPS, "--save_total_limit", 1, "--kill_at", 3, "--kill_point", "before_marker",
                       nproc=1)  # fmt: skip
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert [os.path.basename(c) for c in checkpoint.checkpoints_by_step(str(tmp_path))] == [
        "checkpoint-3",
        "checkpoint-2",
    ]
    assert checkpoint.is_complete(str(tmp_path / "checkpoint-2"))
    result, _ = launch(tmp_path, *STEPS, "--save_total_limit", 1, "--resume", "latest", nproc=1)
    assert result.returncode == 0, result.stderr[-3000:]
    assert_same(torch.load(tmp_path / "weights_rank0.pt"), uninterrupted, rtol=0, atol=0)
    assert [os.path.basename(c) for c in checkpoint.checkpoints_by_step(str(tmp_path))] == ["checkpoint-4"]
    # the checkpoint records the limit configured, though the Trainer's own rotation ran without it
    assert torch.load(tmp_path / "checkpoint-4" / "training_args.bin", weights_only=False).save_total_limit == 1
