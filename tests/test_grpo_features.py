"""GRPO features a team gets with TRL's meaning: for one agent and one turn, MAGRPOTrainer gives GRPOTrainer's reward,
loss and SGD step on the same samples; for two agents, each agent's term acts on its own parameters."""

import pytest
import torch
from conftest import SEED_PROMPTS, assert_same_sgd_step
from datasets import Dataset
from test_equivalence import COMMON, chars_reward
from trl import GRPOConfig, GRPOTrainer

from trl_multiagent import MAGRPOConfig, MAGRPOTrainer
from trl_multiagent.demo.testing import make_model


def vowels_reward(completions, **kwargs):
    return [float(sum(ch in "aeiou" for ch in c)) for c in completions]


def stock_and_ours(tmp_path, tokenizer, reward_funcs, dtype=torch.float32, atol=1e-6, **extra):
    """Train one step of GRPOTrainer and of a one-agent MAGRPOTrainer from the same weights; their logs."""
    data = Dataset.from_dict({"prompt": SEED_PROMPTS})
    stock_model = make_model(tokenizer, seed=3).to(dtype)
    before = {k: v.clone() for k, v in stock_model.state_dict().items()}
    stock = GRPOTrainer(
        model=stock_model, reward_funcs=reward_funcs, train_dataset=data, processing_class=tokenizer,
        args=GRPOConfig(output_dir=str(tmp_path / "stock"), **{**COMMON, **extra}),
    )  # fmt: skip
    stock.train()
    ours_model = make_model(tokenizer, seed=3).to(dtype)
    ours = MAGRPOTrainer(
        agents=[ours_model], tokenizer=tokenizer, reward_funcs=reward_funcs, train_dataset=data,
        args=MAGRPOConfig(output_dir=str(tmp_path / "ours"), **{**COMMON, **extra}),
    )  # fmt: skip
    ours.train()
    assert_same_sgd_step(before, stock_model, ours_model, atol)
    return stock.state.log_history[0], ours.state.log_history[0], ours_model


def test_normalize_then_sum_equals_grpo(tmp_path, tokenizer):
    stock, ours, _ = stock_and_ours(
        tmp_path, tokenizer, [chars_reward, vowels_reward], multi_objective_aggregation="normalize_then_sum",
        reward_weights=[1.0, 0.5],
    )  # fmt: skip
    for key in ("reward", "reward_std", "loss", "rewards/chars_reward/mean", "rewards/vowels_reward/mean"):
        assert ours[key] == pytest.approx(stock[key], abs=1e-5), key
    assert stock["reward_std"] > 0.1  # normalised rewards that differ: the advantages are not all zero


def test_lm_head_cast_to_fp32_equals_grpo(tmp_path, tokenizer):
    # bfloat16 agents: a step moves a weight by a few units in its last place (about 2.4e-4 here)
    stock, ours, model = stock_and_ours(
        tmp_path, tokenizer, chars_reward, dtype=torch.bfloat16, atol=5e-4, cast_lm_head_to_fp32=True
    )
    assert ours["loss"] == pytest.approx(stock["loss"], abs=1e-6)
    assert ours["entropy"] == pytest.approx(stock["entropy"], abs=1e-5)
    assert model.lm_head.weight.dtype == torch.float32  # the head trained in float32, as GRPOTrainer's


def test_lm_head_cast_to_fp32_gives_float32_logits_on_each_agent(tmp_path, tokenizer):
    agents = [make_model(tokenizer, seed=s).to(torch.bfloat16) for s in (1, 2)]
    trainer = MAGRPOTrainer(
        agents=agents, tokenizer=tokenizer, reward_func=lambda a, b: [0.0] * len(a),
        train_dataset=Dataset.from_dict({"prompt": SEED_PROMPTS}),
        args=MAGRPOConfig(output_dir=str(tmp_path), **{**COMMON, "cast_lm_head_to_fp32": True}),
    )  # fmt: skip
    ids = torch.tensor([[1, 2, 3]])
    for i in range(2):
        agent = trainer.team.agent(i)
        assert (
            agent.lm_head.weight.dtype == torch.float32
            and agent.model.layers[0].mlp.up_proj.weight.dtype == torch.bfloat16
        )
        assert agent(ids).logits.dtype == torch.float32
        assert agent.get_input_embeddings()(ids).dtype == torch.bfloat16  # the tied embedding's output keeps its dtype
