"""A team of one saves as GRPOTrainer saves: `save_model(dir)` and `checkpoint-N/` hold the model (or adapter) itself,
loadable with `from_pretrained(dir)`; `one_agent_in_agent_folder = True` (the CoMLRL face's layout) keeps `agent_0/`.
Resuming and the evaluation command read both layouts."""

import copy
import os

import pytest
import torch
from conftest import SEED_PROMPTS
from datasets import Dataset
from peft import AutoPeftModelForCausalLM, LoraConfig
from transformers import AutoModelForCausalLM
from trl import GRPOConfig, GRPOTrainer

from trl_multiagent import MAGRPOConfig, MAGRPOTrainer
from trl_multiagent import evaluation as ev
from trl_multiagent.demo.testing import make_model


COMMON = dict(
    num_generations=2, per_device_train_batch_size=4, max_completion_length=6, logging_steps=1, report_to="none",
    seed=5, learning_rate=0.5, optim="sgd", lr_scheduler_type="constant", max_grad_norm=0.0, use_cpu=True,
    bf16=False, save_strategy="steps", save_steps=1, disable_tqdm=True,
)  # fmt: skip
IDS = torch.tensor([[5, 17, 42, 8, 99, 3]])


class AgentFolderTrainer(MAGRPOTrainer):
    """The layout of the CoMLRL face: `agent_0/` even for one agent."""

    one_agent_in_agent_folder = True


def chars(completions, **kwargs):
    return [len(c) / 10 for c in completions]


def ours(tmp_path, model, max_steps=1, trainer_class=MAGRPOTrainer, **kwargs):
    return trainer_class(
        model=model, processing_class=kwargs.pop("tokenizer"), reward_funcs=chars,
        train_dataset=Dataset.from_dict({"prompt": SEED_PROMPTS * 2}),
        args=MAGRPOConfig(output_dir=str(tmp_path), max_steps=max_steps, early_termination_threshold=None, **COMMON),
        **kwargs,
    )  # fmt: skip


@torch.no_grad()
def logits(model):
    model.eval()
    return model(input_ids=IDS).logits


def test_one_agent_saves_its_model_where_grpotrainer_does(tmp_path, tokenizer):
    """The same files as GRPOTrainer's in `save_model(dir)` and in `checkpoint-1/` (and our card and completion
    marker); the folder loads with `AutoModelForCausalLM.from_pretrained` to the trained model's logits, which are
    GRPOTrainer's after the same step."""
    stock = GRPOTrainer(
        model=make_model(tokenizer, seed=3), reward_funcs=chars, processing_class=tokenizer,
        train_dataset=Dataset.from_dict({"prompt": SEED_PROMPTS * 2}),
        args=GRPOConfig(output_dir=str(tmp_path / "stock"), max_steps=1, **COMMON),
    )  # fmt: skip
    stock.train()
    stock.save_model(str(tmp_path / "stock" / "final"))
    trainer = ours(tmp_path / "ours", make_model(tokenizer, seed=3), tokenizer=tokenizer)
    trainer.train()
    trainer.save_model(str(tmp_path / "ours" / "final"))
    for folder, ours_only in (("final", {"README.md"}), ("checkpoint-1", {"README.md", "checkpoint_complete"})):
        stock_files = set(os.listdir(tmp_path / "stock" / folder))
        ours_files = set(os.listdir(tmp_path / "ours" / folder))
        assert {"config.json", "model.safetensors", "tokenizer.json"} <= stock_files
        assert stock_files <= ours_files and ours_files - stock_files <= ours_only, (folder, ours_files ^ stock_files)
    for folder in ("final", "checkpoint-1"):
        loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "ours" / folder)
        torch.testing.assert_close(logits(loaded), logits(trainer.model), rtol=0, atol=0)
        torch.testing.assert_close(logits(loaded), logits(stock.model), rtol=1e-5, atol=1e-5)
    assert logits(trainer.model).sub(logits(make_model(tokenizer, seed=3))).abs().max() > 1e-3  # it trained


def test_one_adapter_agent_saves_its_adapter_where_grpotrainer_does(tmp_path, tokenizer, tiny_model_dir):
    """An adapter from `peft_config`: `dir/adapter_config.json` and its weights, GRPOTrainer's files, loading with
    `AutoPeftModelForCausalLM.from_pretrained(dir)` to the trained model's logits."""
    lora = LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False)
    stock = GRPOTrainer(
        model=tiny_model_dir, reward_funcs=chars, processing_class=tokenizer, peft_config=copy.deepcopy(lora),
        train_dataset=Dataset.from_dict({"prompt": SEED_PROMPTS * 2}),
        args=GRPOConfig(output_dir=str(tmp_path / "stock"), max_steps=1, **COMMON),
    )  # fmt: skip
    stock.save_model(str(tmp_path / "stock" / "final"))
    trainer = MAGRPOTrainer(
        model=tiny_model_dir, processing_class=tokenizer, reward_funcs=chars, peft_config=lora,
        train_dataset=Dataset.from_dict({"prompt": SEED_PROMPTS * 2}),
        args=MAGRPOConfig(output_dir=str(tmp_path / "ours"), max_steps=1, early_termination_threshold=None, **COMMON),
    )  # fmt: skip
    trainer.train()
    trainer.save_model(str(tmp_path / "ours" / "final"))
    stock_files, ours_files = (set(os.listdir(tmp_path / run / "final")) for run in ("stock", "ours"))
    assert {"adapter_config.json", "adapter_model.safetensors"} <= stock_files == ours_files, ours_files ^ stock_files
    for folder in ("final", "checkpoint-1"):
        loaded = AutoPeftModelForCausalLM.from_pretrained(tmp_path / "ours" / folder)
        torch.testing.assert_close(logits(loaded), logits(trainer.model), rtol=0, atol=1e-6)


def test_the_agent_folder_layout_keeps_agent_0(tmp_path, tokenizer):
    trainer = ours(tmp_path, make_model(tokenizer, seed=3), trainer_class=AgentFolderTrainer, tokenizer=tokenizer)
    trainer.train()
    trainer.save_model(str(tmp_path / "final"))
    for folder in (tmp_path / "final", tmp_path / "checkpoint-1"):
        assert not (folder / "config.json").exists() and {"config.json", "model.safetensors"} <= set(
            os.listdir(folder / "agent_0")
        )
        loaded = AutoModelForCausalLM.from_pretrained(folder / "agent_0")
        torch.testing.assert_close(logits(loaded), logits(trainer.model), rtol=0, atol=0)


@pytest.mark.parametrize("trainer_class", [MAGRPOTrainer, AgentFolderTrainer], ids=["flat", "agent_0"])
def test_resuming_a_one_agent_checkpoint_equals_an_uninterrupted_run(tmp_path, tokenizer, trainer_class):
    full = ours(tmp_path / "full", make_model(tokenizer, seed=3), 2, trainer_class, tokenizer=tokenizer)
    full.train()
    resumed = ours(tmp_path / "resumed", make_model(tokenizer, seed=3), 2, trainer_class, tokenizer=tokenizer)
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-1"))
    losses = [[h["loss"] for h in trainer.state.log_history if "loss" in h] for trainer in (full, resumed)]
    assert resumed.state.global_step == 2 and losses[1] == losses[0]  # step 1's from the checkpoint, step 2 rerun
    for name, p in full.model.named_parameters():
        torch.testing.assert_close(resumed.model.get_parameter(name), p, rtol=0, atol=0, msg=name)
    assert logits(full.model).sub(logits(make_model(tokenizer, seed=3))).abs().max() > 1e-3


def one_agent_reward(completions1):
    return [float(len(c)) for c in completions1]


def test_the_evaluation_command_reads_both_layouts(tmp_path, tokenizer):
    """One agent saved flat and in `agent_0/`: the same team, the same greedy answers and rewards."""
    for trainer_class, folder in ((MAGRPOTrainer, "flat"), (AgentFolderTrainer, "nested")):
        trainer = ours(
            tmp_path / "run", make_model(tokenizer, seed=3), trainer_class=trainer_class, tokenizer=tokenizer
        )
        trainer.save_model(str(tmp_path / folder))
    flat, nested = ev.find_team(str(tmp_path / "flat")), ev.find_team(str(tmp_path / "nested"))
    assert flat.agent_dirs == [str(tmp_path / "flat")] and nested.agent_dirs == [str(tmp_path / "nested" / "agent_0")]
    assert flat.kind == nested.kind == "full"
    settings = dict(reward=one_agent_reward, prompts=SEED_PROMPTS, num_turns=1, greedy=True, max_new_tokens=6,
                    best_of_n=False, role_swap=False, progress=False)  # fmt: skip
    results = [ev.evaluate_team(str(tmp_path / folder), **settings)["runs"]["team"] for folder in ("flat", "nested")]
    assert results[0]["per_prompt"] == results[1]["per_prompt"] and results[0]["sampled_tokens"] > 0


def test_the_comlrl_face_saves_one_agent_in_agent_0(tmp_path, tokenizer):
    """CoMLRL's layout, kept by its face: `agent_0/` for a team of one, read back by resuming."""
    from trl_multiagent import comlrl

    def length(completions1):
        return [float(len(c)) for c in completions1]

    def trainer(output_dir, max_steps):
        args = comlrl.MAGRPOConfig(
            output_dir=str(output_dir), num_agents=1, num_turns=1, num_generations=2, max_new_tokens=4,
            max_steps=max_steps, save_strategy="steps", save_steps=1, report_to="none", seed=0, use_cpu=True,
        )  # fmt: skip
        return comlrl.MAGRPOTrainer(
            agents=[make_model(tokenizer, seed=3)], num_agents=1, tokenizer=tokenizer, reward_func=length,
            train_dataset=Dataset.from_dict({"prompt": SEED_PROMPTS}), args=args,
        )  # fmt: skip

    full = trainer(tmp_path / "full", 2)
    assert full.one_agent_in_agent_folder
    full.train()
    full.save_model(str(tmp_path / "final"))
    assert not (tmp_path / "final" / "config.json").exists()
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "final" / "agent_0")
    torch.testing.assert_close(logits(loaded), logits(full.model), rtol=0, atol=0)
    resumed = trainer(tmp_path / "resumed", 2)
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-1"))
    torch.testing.assert_close(logits(resumed.model), logits(full.model), rtol=0, atol=0)
