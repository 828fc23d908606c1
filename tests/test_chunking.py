"""The update in chunks (`update_chunk_size`): the same loss and gradients as one forward/backward over the
micro-batch, for every TRL loss type, with inert padding rows that dilute nothing."""

import pytest
import torch
from conftest import SEED_PROMPTS, length_feedback, length_ratio_reward
from datasets import Dataset

from trl_multiagent import MAGRPOConfig, MAGRPOTrainer
from trl_multiagent.demo.testing import make_model
from trl_multiagent.update.batching import agent_rows, pad_rows
from trl_multiagent.update.chunking import LOSS_TYPES, update_chunks


SGD = dict(learning_rate=0.5, optim="sgd", lr_scheduler_type="constant", max_grad_norm=0.0)


def random_rows(tokenizer, generator, rows=7, prompt_lengths=(3, 9), completion_lengths=(1, 8)):
    def ids(low, high):
        return torch.randint(
            5, 300, (int(torch.randint(low, high + 1, (1,), generator=generator)),), generator=generator
        ).tolist()

    prompts = [ids(*prompt_lengths) for _ in range(rows)]
    completions = [ids(*completion_lengths) for _ in range(rows)]
    advantages = torch.randn(rows, generator=generator)
    batch = agent_rows(prompts, completions, advantages, tokenizer.pad_token_id)
    batch["num_items_in_batch"] = batch["completion_mask"].sum()
    return batch


def loss_and_gradients(trainer, inputs):
    trainer.model.zero_grad()
    loss = trainer.compute_loss(trainer.model, inputs)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in trainer.model.parameters() if p.grad is not None]


@pytest.mark.parametrize("entropy_coef", [0.0, 0.1])
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_chunked_loss_and_gradients_equal_one_pass_and_ignore_inert_rows(tmp_path, tokenizer, loss_type, entropy_coef):
    """TRL's own `_compute_loss`, two agents: chunks of 2 rows over a batch padded with inert rows give the loss and
    gradients of one pass over the real rows alone; with the entropy bonus too (each agent's mean over its tokens)."""
    extra = {"importance_sampling_level": "sequence"} if loss_type == "luspo" else {}
    extra["entropy_coef"] = entropy_coef
    args = MAGRPOConfig(
        output_dir=str(tmp_path), num_generations=2, per_device_train_batch_size=2, max_new_tokens=8, beta=0.05,
        loss_type=loss_type, report_to="none", check_functions_before_training=False, **extra,
    )  # fmt: skip
    trainer = MAGRPOTrainer(
        model=[make_model(tokenizer, seed=s) for s in (1, 2)], processing_class=tokenizer, reward_funcs=length_ratio_reward,
        train_dataset=Dataset.from_dict({"prompt": SEED_PROMPTS}), args=args,
    )  # fmt: skip
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    generator = torch.Generator().manual_seed(0)
    real = [random_rows(tokenizer, generator) for _ in range(2)]
    for batch in real:  # KL against a reference that differs from the policy, so the KL term has a gradient
        batch["ref_per_token_logps"] = -3.0 * torch.rand(batch["completion_ids"].shape, generator=generator)
    padded = [pad_rows(batch, 10) for batch in real]  # 3 inert rows per agent

    trainer.update_chunk_size = 100
    loss, gradients = loss_and_gradients(trainer, real)
    trainer.update_chunk_size = 2
    assert len(update_chunks(padded, 2, loss_type)) == 5
    chunked_loss, chunked_gradients = loss_and_gradients(trainer, padded)

    assert loss.abs() > 1e-4 and len(gradients) > 10
    torch.testing.assert_close(chunked_loss, loss, rtol=1e-5, atol=1e-7)
    for chunked, whole in zip(chunked_gradients, gradients, strict=True):
        torch.testing.assert_close(chunked, whole, rtol=1e-4, atol=1e-7)


def test_update_chunks_keep_rows_and_refuse_uneven_agents(tokenizer):
    generator = torch.Generator().manual_seed(1)
    batch = pad_rows(random_rows(tokenizer, generator, rows=5), 6)
    chunks = update_chunks([batch, batch], 4, "grpo")
    assert [len(c[0][0]["advantages"]) for c in chunks] == [4, 2]
    # every row lands in exactly one chunk: the advantages, as a multiset, are the batch's
    together = torch.cat([c[0][0]["advantages"] for c in chunks])
    torch.testing.assert_close(together.sort().values, batch["advantages"].sort().values)
    # grpo weighs a chunk's rows (inert ones included) against the 5 real rows
    assert [c[1][0] for c in chunks] == [4 / 5, 2 / 5]
    with pytest.raises(ValueError, match=r"update_chunks: every agent must have the same number of rows.*\[6, 5\]"):
        update_chunks([batch, random_rows(tokenizer, generator, rows=5)], 4, "grpo")
    with pytest.raises(ValueError, match="update_chunks: chunk_rows must be >= 1, got 0"):
        update_chunks([batch], 0, "grpo")


def train_one_step(tmp_path, tokenizer, update_chunk_size, **extra):
    agents = [make_model(tokenizer, seed=s) for s in (1, 2)]
    args = MAGRPOConfig(
        output_dir=str(tmp_path / f"chunk_{update_chunk_size}"), num_generations=4, per_device_train_batch_size=4,
        steps_per_generation=2, max_new_tokens=8, max_steps=1, num_turns=2, early_termination_threshold=0.5,
        report_to="none", seed=0, logging_steps=1, update_chunk_size=update_chunk_size, **SGD, **extra,
    )  # fmt: skip
    trainer = MAGRPOTrainer(
        model=agents, processing_class=tokenizer, reward_funcs=length_ratio_reward, external_transition=length_feedback,
        train_dataset=Dataset.from_dict({"prompt": SEED_PROMPTS[:2]}), args=args,
    )  # fmt: skip
    before = [{k: v.clone() for k, v in a.state_dict().items()} for a in agents]
    trainer.train()
    steps = [{k: a.state_dict()[k] - v for k, v in b.items()} for a, b in zip(agents, before, strict=True)]
    return trainer.state.log_history[0], steps


@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_chunked_training_step_equals_unchunked(tmp_path, tokenizer, loss_type):
    """Two agents, two turns, early termination, two accumulation steps (inert rows pad the second): one SGD step
    with chunks of 1 and 3 rows per agent moves the weights as one pass per micro-batch does."""
    whole_log, whole_steps = train_one_step(tmp_path, tokenizer, 1000, loss_type=loss_type)
    assert 0 < whole_log["turn_1/terminated_frac"] < 1  # an uneven tree
    for size in (1, 3):
        log, steps = train_one_step(tmp_path, tokenizer, size, loss_type=loss_type)
        assert log["turn_2/reward_mean"] == pytest.approx(whole_log["turn_2/reward_mean"], abs=1e-6)  # same rollout
        assert log["loss"] == pytest.approx(whole_log["loss"], rel=1e-4, abs=1e-7)
        moved = 0
        for chunked, whole in zip(steps, whole_steps, strict=True):
            for name, step in whole.items():
                torch.testing.assert_close(chunked[name], step, rtol=1e-4, atol=1e-5, msg=name)
                moved += int(step.abs().max() > 1e-5)
        assert moved > 20


def test_generation_in_chunks_keeps_nodes_together_and_equals_one_call(tmp_path, tokenizer, monkeypatch):
    """`generate_chunk_size=5` with K=2: calls of 2 prompts (4 rows), and greedy completions equal one call's."""
    from trl_multiagent.generation.hf import TransformersGenerator

    calls = []
    generate = TransformersGenerator._generate

    def recording(self, model, agent, prompt_ids, *args, **kwargs):
        calls.append(len(prompt_ids))
        return generate(self, model, agent, prompt_ids, *args, **kwargs)

    monkeypatch.setattr(TransformersGenerator, "_generate", recording)
    completions = {}
    for size in (None, 5):
        args = MAGRPOConfig(
            output_dir=str(tmp_path), num_generations=2, per_device_train_batch_size=2, max_new_tokens=6,
            report_to="none", generate_chunk_size=size, check_functions_before_training=False,
        )  # fmt: skip
        trainer = MAGRPOTrainer(
            model=[make_model(tokenizer, seed=1)], processing_class=tokenizer, reward_funcs=lambda completions: [0.0] * len(completions),
            train_dataset=Dataset.from_dict({"prompt": SEED_PROMPTS}), args=args,
        )  # fmt: skip
        calls.clear()
        generation = trainer.generator.generate(0, (SEED_PROMPTS * 2)[:5], 2, greedy=True)
        completions[size] = generation.completion_ids
        assert calls == ([5] if size is None else [2, 2, 1])
    assert len(completions[5]) == 10
    assert completions[5] == completions[None]


def test_chunks_hold_whole_prompt_groups_despite_inert_rows(tokenizer):
    """K=4 rows per prompt, three prompts, two inert rows (copies of the first row's prompt): chunks of 4 rows hold
    one prompt each, and the inert rows a chunk of their own."""
    generator = torch.Generator().manual_seed(2)
    prompts = [torch.randint(5, 300, (n,), generator=generator).tolist() for n in (3, 3, 5)]
    rows = [prompts[p] for p in (0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2)]
    completions = [torch.randint(5, 300, (n,), generator=generator).tolist() for n in range(1, 13)]
    batch = pad_rows(agent_rows(rows, completions, torch.randn(12, generator=generator), tokenizer.pad_token_id), 14)
    chunks = update_chunks([batch], 4, "grpo")
    assert len(chunks) == 4
    for (agent_chunks, _), expected_real in zip(chunks, (4, 4, 4, 0), strict=True):
        chunk = agent_chunks[0]
        assert int(chunk["is_real"].sum()) == min(expected_real, len(chunk["is_real"]))
        if expected_real:
            prompt = chunk["prompt_ids"].masked_fill(chunk["prompt_mask"] == 0, -1)
            assert torch.unique(prompt, dim=0).size(0) == 1  # one prompt per chunk
