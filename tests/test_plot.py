"""`trl_multiagent.demo.plot`: reward and length curves from a log history or a run folder."""

import json
import os
import struct
import sys

import pytest
from conftest import SEED_PROMPTS, length_feedback, length_ratio_reward
from datasets import Dataset

from trl_multiagent import MAGRPOConfig, MAGRPOTrainer
from trl_multiagent.demo import plot as plot_module
from trl_multiagent.demo.plot import find_trainer_state, plot_run
from trl_multiagent.demo.testing import make_model


pytest.importorskip("matplotlib")

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
EXPECTED_SIZE = (int(plot_module.FIGSIZE[0] * plot_module.DPI), int(plot_module.FIGSIZE[1] * plot_module.DPI))


def png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def check_png(path):
    assert path.exists()
    assert path.stat().st_size > 5 * 1024
    assert png_size(path) == EXPECTED_SIZE == (1100, 400)


def hand_log(steps=5):
    history = []
    for step in range(1, steps + 1):
        history.append({
            "loss": 0.1, "step": step, "epoch": step / steps,
            "turn_1/reward_mean": 0.3 + 0.02 * step, "turn_1/reward_std": 0.05,
            "turn_2/reward_mean": 0.35 + 0.03 * step, "turn_2/reward_std": 0.1,
            "agent_0/completions/mean_length": 20.0 + step, "agent_1/completions/mean_length": 40.0 + 2 * step,
        })  # fmt: skip
    history.append({"train_runtime": 12.0, "train_loss": 0.1, "step": steps, "epoch": 1.0})
    return history


def test_plot_from_a_hand_built_log_history(tmp_path):
    out = tmp_path / "curves" / "rewards.png"
    assert plot_run(hand_log(), out) == str(out)
    check_png(out)
    import matplotlib.image

    assert matplotlib.image.imread(out).shape[:2] == (EXPECTED_SIZE[1], EXPECTED_SIZE[0])


def test_one_panel_missing_is_drawn_empty(tmp_path):
    history = [{k: v for k, v in e.items() if not k.startswith("agent_")} for e in hand_log()]
    plot_run(history, tmp_path / "p.png")
    check_png(tmp_path / "p.png")


def write_state(path, step, mtime, history=()):
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps({"global_step": step, "log_history": list(history)}))
    os.utime(path, (mtime, mtime))


def test_newest_trainer_state_is_found(tmp_path):
    write_state(tmp_path / "checkpoint-2" / "trainer_state.json", 2, 1000)
    write_state(tmp_path / "checkpoint-4" / "trainer_state.json", 4, 2000)
    write_state(tmp_path / "checkpoint-10" / "trainer_state.json", 10, 2000)  # same time: the later step wins
    assert find_trainer_state(tmp_path) == tmp_path / "checkpoint-10" / "trainer_state.json"
    # the last written wins, even over a checkpoint of an earlier, longer run left in the same folder
    write_state(tmp_path / "trainer_state.json", 5, 3000, hand_log())
    assert find_trainer_state(tmp_path) == tmp_path / "trainer_state.json"
    assert plot_run(tmp_path) == str(tmp_path / "rewards.png")  # next to the run by default
    check_png(tmp_path / "rewards.png")


def test_clear_errors(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match="no trainer_state.json"):
        plot_run(tmp_path)
    with pytest.raises(FileNotFoundError, match="not a folder"):
        plot_run(tmp_path / "missing")
    with pytest.raises(ValueError, match=r"no `turn_\{t\}/reward_mean`.*keys: \['loss', 'step'\]"):
        plot_run([{"loss": 1.0, "step": 1}], tmp_path / "x.png")
    with pytest.raises(ValueError, match="out_png"):
        plot_run(hand_log())
    monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)
    with pytest.raises(ImportError, match=r"needs matplotlib.*\.\[demo\]"):
        plot_run(hand_log(), tmp_path / "x.png")
    assert plot_module.main([str(tmp_path / "missing")]) == 1


def test_plot_a_real_tiny_run(tmp_path, tokenizer):
    args = MAGRPOConfig(
        output_dir=str(tmp_path / "run"), num_turns=2, early_termination_threshold=None, num_generations=4,
        per_device_train_batch_size=8, max_new_tokens=4, max_steps=2, logging_steps=1, report_to="none", seed=0,
    )  # fmt: skip
    trainer = MAGRPOTrainer(
        model=[make_model(tokenizer, seed=i) for i in range(2)], processing_class=tokenizer,
        reward_funcs=length_ratio_reward, external_transition=length_feedback,
        train_dataset=Dataset.from_dict({"prompt": SEED_PROMPTS}), args=args,
    )  # fmt: skip
    trainer.train()
    logged = [e for e in trainer.state.log_history if "turn_2/reward_mean" in e]
    assert len(logged) == 2

    out = tmp_path / "from_history.png"
    plot_run(trainer.state.log_history, out)
    check_png(out)

    # from the run folder: the trainer saved checkpoint-2 (with its trainer_state.json) at the end
    assert find_trainer_state(tmp_path / "run") == tmp_path / "run" / "checkpoint-2" / "trainer_state.json"
    out = tmp_path / "from_cli.png"
    assert plot_module.main([str(tmp_path / "run"), "--out", str(out)]) == 0
    check_png(out)
