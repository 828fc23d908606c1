"""One agent, one turn: MAGRPOTrainer must reproduce stock GRPOTrainer's loss and gradients."""

import pytest
import torch
from conftest import SEED_PROMPTS, assert_same_sgd_step
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from trl_multiagent import MAGRPOConfig, MAGRPOTrainer
from trl_multiagent.demo.testing import make_model


def chars_reward(completions, **kwargs):
    return [float(len(c)) / 10 for c in completions]


COMMON = dict(
    num_generations=4,
    per_device_train_batch_size=8,
    max_completion_length=12,
    max_steps=1,
    logging_steps=1,
    report_to="none",
    seed=7,
    learning_rate=0.5,
    optim="sgd",  # one SGD step moves weights by exactly -lr * gradient, so weights compare gradients
    lr_scheduler_type="constant",
    max_grad_norm=0.0,
    use_cpu=True,
    bf16=False,
)


@pytest.mark.parametrize("loss_type, scale_rewards", [("dapo", "group"), ("grpo", "batch"), ("dr_grpo", "none")])
def test_single_agent_single_turn_equals_grpo(tmp_path, tokenizer, loss_type, scale_rewards):
    data = Dataset.from_dict({"prompt": SEED_PROMPTS})
    extra = dict(loss_type=loss_type, scale_rewards=scale_rewards)

    stock_model = make_model(tokenizer, seed=3)
    before = {k: v.clone() for k, v in stock_model.state_dict().items()}
    stock = GRPOTrainer(
        model=stock_model, reward_funcs=chars_reward, train_dataset=data, processing_class=tokenizer,
        args=GRPOConfig(output_dir=str(tmp_path / "stock"), **COMMON, **extra),
    )  # fmt: skip
    stock.train()

    ours_model = make_model(tokenizer, seed=3)
    ours = MAGRPOTrainer(
        model=[ours_model], processing_class=tokenizer, reward_funcs=chars_reward, train_dataset=data,
        args=MAGRPOConfig(output_dir=str(tmp_path / "ours"), **COMMON, **extra),
    )  # fmt: skip
    ours.train()

    stock_log, ours_log = stock.state.log_history[0], ours.state.log_history[0]
    assert ours_log["reward"] == pytest.approx(stock_log["reward"], abs=1e-6)
    assert ours_log["loss"] == pytest.approx(stock_log["loss"], abs=1e-6)
    assert_same_sgd_step(before, stock_model, ours_model)


@pytest.mark.parametrize("modules_to_save", [["lm_head"], ["embed_tokens"]])
def test_one_agent_trains_modules_to_save_as_grpotrainer(tmp_path, tokenizer, modules_to_save):
    """A team of one takes GRPOTrainer's PEFT settings: its `modules_to_save` (the LM head included) train, and one SGD
    step moves every weight as GRPOTrainer's does."""
    from peft import LoraConfig

    data = Dataset.from_dict({"prompt": SEED_PROMPTS})

    def lora():
        return LoraConfig(r=4, target_modules="all-linear", modules_to_save=modules_to_save)

    stock = GRPOTrainer(
        model=make_model(tokenizer, seed=3), reward_funcs=chars_reward, train_dataset=data, processing_class=tokenizer,
        peft_config=lora(), args=GRPOConfig(output_dir=str(tmp_path / "stock"), **COMMON),
    )  # fmt: skip
    before = {k: v.clone() for k, v in stock.model.state_dict().items()}
    stock.train()
    ours = MAGRPOTrainer(
        model=make_model(tokenizer, seed=3), processing_class=tokenizer, reward_funcs=chars_reward,
        train_dataset=data, peft_config=lora(),
        args=MAGRPOConfig(output_dir=str(tmp_path / "ours"), early_termination_threshold=None, **COMMON),
    )  # fmt: skip
    assert before.keys() == ours.model.state_dict().keys()  # GRPOTrainer's PEFT model: adapter "default"
    ours.model.load_state_dict(before)  # the same start (each trainer drew its adapter's initialisation)
    trained = [k for k in before if "modules_to_save.default" in k]
    assert trained and all(ours.model.get_parameter(k).requires_grad for k in trained)
    ours.train()
    assert ours.state.log_history[0]["loss"] == pytest.approx(stock.state.log_history[0]["loss"], abs=1e-6)
    assert_same_sgd_step(before, stock.model, ours.model)
    assert all(not torch.equal(before[k], ours.model.state_dict()[k]) for k in trained)
