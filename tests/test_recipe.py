"""recipes/length_ratio.py run in-process on a tiny local model: parsing, training, saving, summary and plot."""

import importlib.util
import os
import sys

import pytest


RECIPE = os.path.join(os.path.dirname(__file__), "..", "recipes", "length_ratio.py")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def recipe():
    spec = importlib.util.spec_from_file_location("length_ratio_recipe", RECIPE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve the recipe's string annotations through sys.modules
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def parse(recipe, *flags):
    return recipe.make_parser().parse_args_and_config(args=list(flags))


def test_defaults_keep_the_example_semantics(recipe, tmp_path):
    # With a model: the example's own size.
    _, args = parse(recipe, "--model_name_or_path", "some/model")
    assert (args.num_turns, args.num_generations, args.early_termination_threshold) == (2, 4, 0.9)
    assert (args.num_train_epochs, args.max_steps, args.per_device_train_batch_size) == (2, -1, 8)
    assert args.max_new_tokens == 64
    assert args.logging_steps == 1 and args.output_dir == "outputs/length_ratio" and args.save_strategy == "steps"

    # Without one: the embedded default model, demo-sized, with the same semantics.
    script_args, args = parse(recipe)
    assert script_args.model_name_or_path is None
    assert (args.num_turns, args.num_generations, args.early_termination_threshold) == (2, 4, 0.9)
    assert (args.max_steps, args.per_device_train_batch_size, args.max_new_tokens) == (2, 4, 24)
    assert args.save_strategy == "no" and args.gradient_checkpointing is False and args.logging_steps == 1

    # Flags win over the demo size; a model named in a --config YAML counts as named.
    flags = ["--max_steps", "-1", "--num_train_epochs", "2", "--per_device_train_batch_size", "8",
             "--max_new_tokens", "64"]  # fmt: skip
    _, args = parse(recipe, *flags)
    assert (args.max_steps, args.num_train_epochs, args.per_device_train_batch_size) == (-1, 2, 8)
    assert args.max_completion_length == 64
    config = tmp_path / "recipe.yaml"
    config.write_text("model_name_or_path: some/model\nmax_new_tokens: 16\n")
    script_args, args = parse(recipe, "--config", str(config))
    assert script_args.model_name_or_path == "some/model"
    assert (args.max_steps, args.num_train_epochs, args.max_new_tokens) == (-1, 2, 16)


def test_recipe_trains_saves_and_plots(recipe, tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    flags = ["--model_name_or_path", tiny_model_dir, "--output_dir", str(out), "--max_steps", "2",
             "--max_new_tokens", "4", "--report_to", "none", "--seed", "0"]  # fmt: skip
    trainer = recipe.main(*parse(recipe, *flags))
    assert trainer.state.global_step == 2
    for i in range(2):
        assert (out / f"agent_{i}" / "config.json").is_file()
        assert (out / f"agent_{i}" / "model.safetensors").is_file()
        assert (out / f"agent_{i}" / "tokenizer.json").is_file()
    assert (out / "trainer_state.json").is_file()
    png = out / "rewards.png"
    assert png.is_file() and png.read_bytes()[:8] == PNG_SIGNATURE and png.stat().st_size > 5 * 1024

    printed = capsys.readouterr().out
    assert "Summary (steps 1 -> 2" in printed
    for key in ("turn_1/reward_mean", "turn_2/reward_mean", "agent_0/completions/mean_length",
                "agent_1/completions/mean_length"):  # fmt: skip
        line = next(line for line in printed.splitlines() if line.strip().startswith(key))
        assert "->" in line and "not logged" not in line
    assert f"Reward curves: {png}" in printed


def test_without_a_model_the_embedded_default_is_prepared(recipe, tiny_model_dir, tmp_path, monkeypatch, capsys):
    calls = []

    def fake_prepare(cache_dir=None):
        calls.append(cache_dir)
        return tiny_model_dir

    monkeypatch.setattr(recipe, "prepare_default_model", fake_prepare)
    flags = ["--output_dir", str(tmp_path / "run"), "--max_steps", "1", "--max_new_tokens", "4", "--report_to", "none"]
    recipe.main(*parse(recipe, *flags))
    assert calls == [None]
    assert f"Default model: {tiny_model_dir}" in capsys.readouterr().out
    assert (tmp_path / "run" / "agent_1" / "model.safetensors").is_file()


def test_num_agents_other_than_two_is_refused(recipe, tmp_path):
    with pytest.raises(ValueError, match="--num_agents must be 2"):
        recipe.main(*parse(recipe, "--num_agents", "3", "--output_dir", str(tmp_path)))
