"""GRPO features a team gets with TRL's meaning: for one agent and one turn, MAGRPOTrainer gives GRPOTrainer's reward,
loss and SGD step on the same samples; for two agents, each agent's term acts on its own parameters."""

import pytest
import torch
from conftest import SEED_PROMPTS, assert_same_sgd_step
from datasets import Dataset
from peft import LoraConfig
from test_equivalence import COMMON, chars_reward
from transformers import AutoModelForCausalLM
from trl import GRPOConfig, GRPOTrainer

from trl_multiagent import MAGRPOConfig, MAGRPOTrainer
from trl_multiagent.demo.testing import make_model


def vowels_reward(completions, **kwargs):
    return [float(sum(ch in "aeiou" for ch in c)) for c in completions]


def stock_and_ours(
    tmp_path, tokenizer, reward_funcs, dtype=torch.float32, atol=1e-6, model_dir=None, ours_only=None, **extra
):
    """Train GRPOTrainer and a one-agent MAGRPOTrainer from the same weights (a tiny model, or `model_dir` loaded by
    both trainers); check that every weight moved alike, and return their first logs and the trainers."""
    data = Dataset.from_dict({"prompt": SEED_PROMPTS})
    trainers = []
    for kind in ("stock", "ours"):
        model = model_dir or make_model(tokenizer, seed=3).to(dtype)
        args = dict(output_dir=str(tmp_path / kind), **{**COMMON, **extra})
        if kind == "stock":
            trainer = GRPOTrainer(
                model=model, reward_funcs=reward_funcs, train_dataset=data, processing_class=tokenizer,
                args=GRPOConfig(**args),
            )  # fmt: skip
        else:
            trainer = MAGRPOTrainer(
                model=[model], processing_class=tokenizer, reward_funcs=reward_funcs, train_dataset=data,
                args=MAGRPOConfig(**args, **(ours_only or {})),
            )  # fmt: skip
        policy = trainer.model if kind == "stock" else trainer.team.agent(0)
        before = {k: v.clone() for k, v in policy.state_dict().items()}
        trainer.train()
        trainers.append((trainer, policy))
    (stock, stock_policy), (ours, ours_policy) = trainers
    assert_same_sgd_step(before, stock_policy, ours_policy, atol)
    return stock.state.log_history[0], ours.state.log_history[0], stock, ours


def test_normalize_then_sum_equals_grpo(tmp_path, tokenizer):
    stock, ours, _, _ = stock_and_ours(
        tmp_path, tokenizer, [chars_reward, vowels_reward], multi_objective_aggregation="normalize_then_sum",
        reward_weights=[1.0, 0.5],
    )  # fmt: skip
    for key in ("reward", "reward_std", "loss", "rewards/chars_reward/mean", "rewards/vowels_reward/mean"):
        assert ours[key] == pytest.approx(stock[key], abs=1e-5), key
    assert stock["reward_std"] > 0.1  # normalised rewards that differ: the advantages are not all zero


def test_lm_head_cast_to_fp32_equals_grpo(tmp_path, tokenizer):
    # bfloat16 agents: a step moves a weight by a few units in its last place (about 2.4e-4 here)
    stock, ours, _, trainer = stock_and_ours(
        tmp_path, tokenizer, chars_reward, dtype=torch.bfloat16, atol=5e-4, cast_lm_head_to_fp32=True
    )
    assert ours["loss"] == pytest.approx(stock["loss"], abs=1e-6)
    assert ours["entropy"] == pytest.approx(stock["entropy"], abs=1e-5)
    assert trainer.team.agent(0).lm_head.weight.dtype == torch.float32  # the head trained in float32, as GRPOTrainer's


def test_lm_head_cast_to_fp32_gives_float32_logits_on_each_agent(tmp_path, tokenizer):
    agents = [make_model(tokenizer, seed=s).to(torch.bfloat16) for s in (1, 2)]
    trainer = MAGRPOTrainer(
        model=agents, processing_class=tokenizer, reward_funcs=lambda a, b: [0.0] * len(a),
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


@pytest.mark.parametrize("sync_ref_model", [False, True])
def test_reference_equals_grpo(tmp_path, tokenizer, tiny_model_dir, sync_ref_model):
    # beta > 0: step 2's KL term is taken against the reference; synced, the reference was mixed half-way toward the
    # policy after step 1
    sync = dict(
        beta=0.5, sync_ref_model=sync_ref_model, ref_model_sync_steps=1, ref_model_mixup_alpha=0.5, max_steps=2
    )
    _, _, stock, ours = stock_and_ours(tmp_path, tokenizer, chars_reward, model_dir=tiny_model_dir, **sync)
    second = [ours.state.log_history[1], stock.state.log_history[1]]
    assert second[0]["kl"] == pytest.approx(second[1]["kl"], rel=1e-4) and second[1]["kl"] > 0
    assert second[0]["loss"] == pytest.approx(second[1]["loss"], abs=1e-7)
    assert ours.ref_model is ours.ref_team.agent(0)  # GRPOTrainer's name for it: a team of one's is the agent's copy
    stock_reference = stock.accelerator.unwrap_model(stock.ref_model).state_dict()
    ours_reference = ours.ref_team.agent(0).state_dict()
    initial = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    moved = 0
    for name, value in stock_reference.items():
        torch.testing.assert_close(ours_reference[name], value, rtol=1e-5, atol=1e-7, msg=name)
        moved += int(not torch.equal(value, initial[name]))
    assert moved > 10 if sync_ref_model else moved == 0  # synced references moved toward the policy


def two_agent_trainer(tmp_path, tokenizer, model=None, peft_config=None, **overrides):
    """Two full agents, or one shared base with two LoRA adapters."""
    kwargs = dict(model=model) if model else dict(model=make_model(tokenizer, seed=0), num_agents=2)
    if not model:
        peft_config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    if peft_config is not None:
        kwargs["peft_config"] = peft_config
    args = dict(output_dir=str(tmp_path), **{**COMMON, "learning_rate": 0.05, **overrides})
    return MAGRPOTrainer(
        **kwargs, processing_class=tokenizer, reward_funcs=lambda a, b: [len(x) - len(y) / 2 for x, y in zip(a, b, strict=True)],
        train_dataset=Dataset.from_dict({"prompt": SEED_PROMPTS}), args=MAGRPOConfig(**args),
    )  # fmt: skip


SYNC_EVERY_STEP = dict(beta=0.1, sync_ref_model=True, ref_model_sync_steps=1, ref_model_mixup_alpha=0.25)


def test_two_full_agents_each_reference_moves_toward_its_own_policy(tmp_path, tokenizer):
    trainer = two_agent_trainer(
        tmp_path, tokenizer, [make_model(tokenizer, seed=s) for s in (1, 2)], **SYNC_EVERY_STEP
    )
    initial = [{k: v.clone() for k, v in trainer.team.agent(i).state_dict().items()} for i in range(2)]
    trainer.train()
    for i in range(2):  # reference_i = 0.75 * initial_i + 0.25 * policy_i, with agent i's own weights
        policy, reference = trainer.team.agent(i).state_dict(), trainer.ref_team.agent(i).state_dict()
        moved = 0
        for name, start in initial[i].items():
            torch.testing.assert_close(reference[name], 0.75 * start + 0.25 * policy[name], msg=f"agent {i}: {name}")
            moved += int(not torch.equal(start, policy[name]))
        assert moved > 10


def test_shared_base_each_reference_adapter_moves_toward_its_own_adapter(tmp_path, tokenizer):
    trainer = two_agent_trainer(tmp_path, tokenizer, **SYNC_EVERY_STEP)
    model, names = trainer.team.agent(0), trainer.team.adapter_names
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    trainer.train()
    after = model.state_dict()
    for name in names:
        keys = [k for k in initial if f".{name}." in k]
        assert keys and any(not torch.equal(initial[k], after[k]) for k in keys)  # the adapter trained
        for key in keys:  # reference_{name} = 0.75 * initial adapter + 0.25 * trained adapter
            reference = after[key.replace(f".{name}.", f".reference_{name}.")]
            torch.testing.assert_close(reference, 0.75 * initial[key] + 0.25 * after[key], msg=key)
    base = [k for k in initial if "lora_" not in k]
    assert all(torch.equal(initial[k], after[k]) for k in base)  # the base never moves
    assert all(not p.requires_grad for k, p in model.named_parameters() if "reference_" in k)
    kl = [h["kl"] for h in trainer.state.log_history if "kl" in h]
    assert kl[0] == 0.0  # the reference adapters start equal to the agents' adapters


def test_sync_ref_model_with_separate_peft_agents_is_refused_with_the_alternative(tmp_path, tokenizer):
    with pytest.raises(ValueError, match=r"sync_ref_model=True with agents that are PEFT models of their own is not "
                                         r"supported.*one shared base"):  # fmt: skip
        two_agent_trainer(
            tmp_path, tokenizer, [make_model(tokenizer, seed=s) for s in (1, 2)], **SYNC_EVERY_STEP,
            peft_config=LoraConfig(r=4, target_modules=["q_proj"], task_type="CAUSAL_LM"),
        )  # fmt: skip


@pytest.mark.parametrize(
    "loss_type, update_chunk_size", [("dapo", None), ("grpo", 3), ("bnpo", 2), ("dr_grpo", 5)]
)  # one chunk, and chunks weighted by rows, by tokens, by rows over the longest completion
def test_entropy_bonus_equals_grpo(tmp_path, tokenizer, loss_type, update_chunk_size):
    # GRPOTrainer has no update_chunk_size: MAGRPOConfig's goes through `extra`, which GRPOConfig does not get
    stock, ours, _, _ = stock_and_ours(
        tmp_path,
        tokenizer,
        chars_reward,
        entropy_coef=0.05,
        loss_type=loss_type,
        ours_only={"update_chunk_size": update_chunk_size},
    )
    for key in ("loss", "policy_loss", "entropy_coef"):
        assert ours[key] == pytest.approx(stock[key], abs=1e-6), key
    # the `entropy` metric is TRL's per call: in chunks, the mean of the chunks' means (the bonus is not)
    assert ours["entropy"] == pytest.approx(stock["entropy"], abs=1e-6 if update_chunk_size is None else 1e-4)
    assert stock["loss"] != pytest.approx(stock["policy_loss"], abs=1e-3)  # the bonus is in the loss


def test_adaptive_entropy_equals_grpo(tmp_path, tokenizer):
    # step 1 measures the entropy (about 6 nats here, below the target): the coefficient rises and applies in step 2
    adaptive = dict(
        use_adaptive_entropy=True, entropy_coef=0.1, entropy_target=10.0, entropy_coef_delta=0.5, max_steps=2
    )
    _, _, stock, ours = stock_and_ours(tmp_path, tokenizer, chars_reward, **adaptive)
    for s, o in zip(stock.state.log_history[:2], ours.state.log_history[:2], strict=True):
        for key in ("loss", "policy_loss", "entropy", "entropy_coef"):
            assert o[key] == pytest.approx(s[key], abs=1e-6), key
    assert [h["entropy_coef"] for h in ours.state.log_history[:2]] == pytest.approx([0.6, 1.0])  # capped at max 1.0
    assert ours.entropy_coef == stock.entropy_coef == pytest.approx(1.0)  # GRPOTrainer's attribute, as TRL reads it


def test_two_agents_on_a_shared_base_each_entropy_term_moves_its_own_adapter(tmp_path, tokenizer):
    from test_chunking import random_rows

    from trl_multiagent.update.batching import loss_mask

    def gradients(trainer, inputs):
        trainer.model.zero_grad()
        trainer.compute_loss(trainer.model, inputs).backward()
        return {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}

    trainer = two_agent_trainer(tmp_path, tokenizer, entropy_coef=0.1)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    generator = torch.Generator().manual_seed(0)
    rows = [random_rows(tokenizer, generator) for _ in range(2)]
    with_bonus = gradients(trainer, rows)
    trainer.entropy_control.coefs = [0.0, 0.0]
    without = gradients(trainer, rows)

    expected = {n: torch.zeros_like(g) for n, g in without.items()}
    for agent, batch in enumerate(rows):  # -0.1 * the gradient of the agent's own mean entropy over its tokens
        trainer.model.zero_grad()
        with trainer.team.acting(agent):
            ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
            mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
            _, entropies, _ = trainer._get_per_token_logps_and_entropies(
                trainer.model, ids, mask, batch["completion_ids"].size(1), compute_entropy=True
            )
        tokens = loss_mask(batch)
        ((entropies * tokens).sum() / tokens.sum()).backward()
        for n, p in trainer.model.named_parameters():
            if p.grad is not None:
                expected[n] -= 0.1 * p.grad
    for name in without:
        torch.testing.assert_close(with_bonus[name] - without[name], expected[name], rtol=1e-3, atol=1e-6, msg=name)
    names = trainer.team.adapter_names
    for agent in range(2):  # each term reached its own adapter, and only it
        own = [n for n in without if f".{names[agent]}." in n]
        assert own and any(expected[n].abs().sum() > 0 for n in own)  # (lora_A has none while lora_B is 0)


def test_two_agents_each_adapt_their_own_entropy_coefficient(tmp_path, tokenizer):
    peaked = make_model(tokenizer, seed=2)
    with torch.no_grad():
        peaked.model.norm.weight.mul_(200.0)  # sharp logits: entropy near 0, where the other agent's is about 6
    trainer = two_agent_trainer(
        tmp_path, tokenizer, [make_model(tokenizer, seed=1), peaked], use_adaptive_entropy=True, entropy_coef=0.2,
        entropy_target=3.0, entropy_coef_delta=0.05, max_steps=2,
    )  # fmt: skip
    trainer.train()
    first = trainer.state.log_history[0]
    # agent 0 is above the target: its coefficient goes down; agent 1 is below it: its coefficient goes up
    assert (first["agent_0/entropy_coef"], first["agent_1/entropy_coef"]) == pytest.approx((0.15, 0.25))
    assert trainer.entropy_control.last_entropies[0] > 3.0 > trainer.entropy_control.last_entropies[1]
    assert trainer.entropy_control.applied(0) == 0.0 and trainer.entropy_control.applied(1) == pytest.approx(0.3)


def test_adaptive_entropy_coefficients_resume_from_a_checkpoint(tmp_path, tokenizer):
    adaptive = dict(
        use_adaptive_entropy=True, entropy_coef=0.2, entropy_target=10.0, entropy_coef_delta=0.05, max_steps=1,
        save_strategy="steps", save_steps=1,
    )  # fmt: skip
    agents = [make_model(tokenizer, seed=s) for s in (1, 2)]
    trainer = two_agent_trainer(tmp_path, tokenizer, agents, **adaptive)
    trainer.train()
    assert trainer.entropy_control.coefs == pytest.approx([0.25, 0.25])
    resumed = two_agent_trainer(tmp_path, tokenizer, agents, **{**adaptive, "max_steps": 2})
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-1"))
    # step 2 starts from the saved coefficients (0.25, applied), not from entropy_coef: both end at 0.3
    assert resumed.entropy_control.coefs == pytest.approx([0.3, 0.3])
    assert [h["entropy_coef"] for h in resumed.state.log_history if "entropy_coef" in h] == pytest.approx([0.25, 0.3])
