"""recipes/length_ratio.py run in-process on a tiny local model: parsing, training, saving, summary and plot."""

import importlib.util
import os
import shutil
import sys

import pytest
import torch

from trl_multiagent.demo.examples import HELD_OUT_PROMPTS
from trl_multiagent.demo.summary import quarter_change
from trl_multiagent.evaluation import load_task, resolve_task


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
    _, args, model_args = parse(recipe, "--model_name_or_path", "some/model")
    assert (args.num_turns, args.num_generations, args.early_termination_threshold) == (2, 4, 0.9)
    assert (args.num_train_epochs, args.max_steps, args.per_device_train_batch_size) == (2, -1, 8)
    assert args.max_new_tokens == 64 and args.learning_rate == 1e-6 and not model_args.use_peft
    assert args.logging_steps == 1 and args.output_dir == "outputs/length_ratio" and args.save_strategy == "steps"

    # Without one: the embedded default model, demo-sized, with the same semantics.
    script_args, args, model_args = parse(recipe)
    assert model_args.model_name_or_path is None
    assert (args.num_turns, args.num_generations, args.early_termination_threshold) == (2, 4, 0.9)
    assert (args.max_steps, args.per_device_train_batch_size, args.max_new_tokens) == (16, 4, 24)
    assert args.save_strategy == "no" and args.gradient_checkpointing is False and args.logging_steps == 1
    assert args.learning_rate == 3e-3 and model_args.use_peft  # the main job's setting: shared-base LoRA, chat prompts
    assert script_args.prompt_format == "chat"
    assert (model_args.lora_r, model_args.lora_alpha, model_args.lora_target_modules) == (16, 32, "all-linear")

    # Flags win over the demo size; a model named in a --config YAML counts as named.
    flags = ["--max_steps", "-1", "--num_train_epochs", "2", "--per_device_train_batch_size", "8",
             "--max_new_tokens", "64"]  # fmt: skip
    _, args, _ = parse(recipe, *flags)
    assert (args.max_steps, args.num_train_epochs, args.per_device_train_batch_size) == (-1, 2, 8)
    assert args.max_completion_length == 64
    config = tmp_path / "recipe.yaml"
    config.write_text("model_name_or_path: some/model\nmax_new_tokens: 16\n")
    _, args, model_args = parse(recipe, "--config", str(config))
    assert model_args.model_name_or_path == "some/model"
    assert (args.max_steps, args.num_train_epochs, args.max_new_tokens) == (-1, 2, 16)


def _help(recipe, capsys, *flags) -> str:
    with pytest.raises(SystemExit):
        parse(recipe, *flags, "--help")
    return capsys.readouterr().out


@pytest.mark.parametrize("flags", [(), ("--model_name_or_path", "some/model")], ids=["embedded", "named"])
def test_help_shows_the_defaults_that_will_apply(recipe, capsys, flags):
    text = _help(recipe, capsys, *flags)
    head = text[: text.index("options:")]  # before argparse's list of every flag
    assert head.startswith("usage: ") and "Two agents, two turns, feedback between turns" in head
    for convention in ("--config FILE.yaml", "--resume_from_checkpoint", "accelerate launch"):
        assert convention in head
    # each key flag's shown default is what parsing the same command line gives
    parsed = {}
    for dataclass in parse(recipe, *flags):
        parsed.update(vars(dataclass))
    for name in set(recipe.KEY_FLAGS) - {flag.removeprefix("--") for flag in flags}:
        line = next(line for line in head.splitlines() if line.lstrip().startswith(f"--{name} "))
        value = getattr(parsed[name], "value", parsed[name])  # enums (save_strategy) show their value
        if isinstance(value, list):  # report_to: "none" becomes []
            value = ",".join(value) or "none"
        assert line.rstrip().endswith(f"[{value}]"), (line, value)
    assert ("embedded SmolLM2-135M-Instruct" in head.split("The flags most runs need")[0]) == (not flags)


def test_recipe_trains_saves_and_plots(recipe, tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    flags = ["--model_name_or_path", tiny_model_dir, "--output_dir", str(out), "--max_steps", "8",
             "--max_new_tokens", "4", "--report_to", "none", "--seed", "0"]  # fmt: skip
    trainer = recipe.main(*parse(recipe, *flags))
    assert trainer.state.global_step == 8
    assert sorted(os.listdir(out / "rollout_trees")) == [f"step_{s:05d}.json.gz" for s in range(1, 9)]  # by default
    for i in range(2):
        assert (out / f"agent_{i}" / "config.json").is_file()
        assert (out / f"agent_{i}" / "model.safetensors").is_file()
        assert (out / f"agent_{i}" / "tokenizer.json").is_file()
    assert (out / "trainer_state.json").is_file()
    png = out / "rewards.png"
    assert png.is_file() and png.read_bytes()[:8] == PNG_SIGNATURE and png.stat().st_size > 5 * 1024
    # the task `python -m trl_multiagent.evaluation <output_dir>` evaluates the saved team on: the recipe's own
    task = resolve_task(str(out))
    assert task.file == str(out / "evaluation_task.json") and task.prompt_format == "plain"
    reward, transition, prompts, chat = load_task(task, tokenizer=None)
    assert (reward, transition) == (recipe.length_ratio_reward, recipe.length_feedback) and not chat
    assert prompts == HELD_OUT_PROMPTS and not set(prompts) & set(recipe.PROMPTS)

    printed = capsys.readouterr().out
    assert "Summary over 8 logged steps: mean of the first 2 -> the last 2" in printed
    history = trainer.state.log_history
    for turn in (1, 2):
        rewards = [e[f"turn_{turn}/reward_mean"] for e in history if f"turn_{turn}/reward_mean" in e]
        change = quarter_change(rewards)
        line = next(line for line in printed.splitlines() if line.strip().startswith(f"turn {turn} reward"))
        assert f"{change.first:.3f} ± {change.first_se:.3f} -> {change.last:.3f} ± {change.last_se:.3f}" in line
        assert line.endswith(f"change {change.change:+.3f} ± {change.se:.3f}: {change.verdict}")
    for agent in (0, 1):
        assert any(line.strip().startswith(f"agent {agent} mean completion length") for line in printed.splitlines())
    assert f"Reward curves: {png}" in printed
    assert f"Evaluation task: {task.file}" in printed
    # what the agents wrote, at the first and the last step: printed when the step ends, and again in the summary
    last = history[-1]["step"]
    for step in (1, last):
        assert printed.count(f"Sample joint answers at step {step}:") == 2


@pytest.fixture
def chat_model_dir(tiny_model_dir, tmp_path):
    """The tiny model with a chat template, as the embedded default model has one."""
    from transformers import AutoTokenizer

    folder = tmp_path / "tiny-chat"
    shutil.copytree(tiny_model_dir, folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant:{% endif %}"
    )
    tokenizer.save_pretrained(folder)
    return str(folder)


def test_without_a_model_the_embedded_default_is_prepared(recipe, chat_model_dir, tmp_path, monkeypatch, capsys):
    calls, seen, seed_reward = [], [], recipe.length_ratio_reward

    def fake_prepare(cache_dir=None):
        calls.append(cache_dir)
        return chat_model_dir

    def length_ratio_reward(completions1, completions2, *, prompts, turn):
        seen.append((turn, prompts))
        return seed_reward(completions1, completions2)

    monkeypatch.setattr(recipe, "prepare_default_model", fake_prepare)
    monkeypatch.setattr(recipe, "length_ratio_reward", length_ratio_reward)
    flags = ["--output_dir", str(tmp_path / "run"), "--max_steps", "1", "--max_new_tokens", "4", "--report_to", "none"]
    recipe.main(*parse(recipe, *flags))
    assert calls == [None]
    assert f"Default model: {chat_model_dir}" in capsys.readouterr().out
    assert (tmp_path / "run" / "agent_1" / "adapter_model.safetensors").is_file()  # the main job trains LoRA adapters
    task = resolve_task(str(tmp_path / "run"))  # the chat form of the feedback, for the chat prompts
    assert task.transition.endswith(":chat_length_feedback") and task.prompt_format == "chat"
    # the main job's chat format: turn 1 is the seed's prompt as a user message, turn 2 the feedback as the next one
    (turn1, prompts1), (turn2, prompts2) = seen[-2:]
    assert (turn1, turn2) == (1, 2)
    for agent in range(2):
        assert all(p == [{"role": "user", "content": p[0]["content"]}] for p in prompts1[agent])
        assert {p[0]["content"] for p in prompts1[agent]} <= set(recipe.PROMPTS)
        assert all(len(p) == 1 and p[0]["role"] == "user" and "Your last answer had" in p[0]["content"]
                   for p in prompts2[agent])  # fmt: skip


def test_num_agents_other_than_two_is_refused(recipe, tmp_path):
    with pytest.raises(ValueError, match="--num_agents must be 2"):
        recipe.main(*parse(recipe, "--num_agents", "3", "--output_dir", str(tmp_path)))


def test_trl_model_flags_build_the_shared_base_lora_team(recipe, tiny_model_dir, tmp_path):
    # TRL's ModelConfig flags, as on TRL's grpo.py: one base, one LoRA adapter per agent on every linear layer.
    flags = ["--model_name_or_path", tiny_model_dir, "--output_dir", str(tmp_path / "run"), "--max_steps", "1",
             "--max_new_tokens", "4", "--report_to", "none", "--use_peft", "--lora_r", "4", "--lora_alpha", "8",
             "--lora_target_modules", "all-linear", "--dtype", "bfloat16", "--attn_implementation", "eager"]  # fmt: skip
    script_args, training_args, model_args = parse(recipe, *flags)
    trainer = recipe.main(script_args, training_args, model_args)
    team = trainer.team
    assert team.is_shared_base and team.adapter_names == ["agent_0", "agent_1"]
    base = team.agents[0]
    assert base.config._attn_implementation == "eager"
    lora_layers = {name.split(".lora_A.")[0] for name, _ in base.named_parameters() if ".lora_A." in name}
    assert {n.rsplit(".", 1)[-1] for n in lora_layers} == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                          "up_proj", "down_proj"}  # fmt: skip
    assert len(lora_layers) == 7 * base.config.num_hidden_layers
    assert {p.dtype for name, p in base.named_parameters() if ".lora_" not in name} == {torch.bfloat16}
    adapters = {name.split(".lora_A.")[1].split(".")[0] for name, _ in base.named_parameters() if ".lora_A." in name}
    assert adapters == {"agent_0", "agent_1"}
    for i in range(2):  # saved as one PEFT adapter per agent
        assert (tmp_path / "run" / f"agent_{i}" / "adapter_config.json").is_file()
