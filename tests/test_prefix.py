"""Shared prompts (`share_prompts`): each distinct prompt runs once, and nothing changes but the compute."""

import inspect

import pytest
import torch
import transformers
from conftest import SEED_PROMPTS, length_feedback, length_ratio_reward
from datasets import Dataset
from transformers import LlamaForCausalLM
from trl.trainer.utils import add_fused_lm_head, pad

from trl_multiagent import MAGRPOConfig, MAGRPOTrainer
from trl_multiagent.demo.testing import make_model
from trl_multiagent.update.batching import length_chunks, prompt_groups
from trl_multiagent.update.prefix import (
    prefill_applies,
    prefilled_cache,
    shared_prompt_logps,
    supports_prompt_sharing,
    uses_reentrant_checkpointing,
)


PAD = 0

# The shared computation passes keys and values through `forward(cache=...)`, which transformers 5.24 has and 5.19
# lacks. Without it `supports_prompt_sharing` is False and the trainer computes plainly (the vLLM environment runs
# transformers 5.19); these tests of the shared path itself then cannot run.
needs_cache_api = pytest.mark.skipif(
    "cache" not in inspect.signature(LlamaForCausalLM.forward).parameters,
    reason=f"share_prompts needs forward(cache=...), which transformers {transformers.__version__} lacks",
)


def left_padded(seqs):
    seqs = [torch.tensor(s) for s in seqs]
    return (
        pad(seqs, padding_value=PAD, padding_side="left"),
        pad([torch.ones_like(s) for s in seqs], padding_value=0, padding_side="left"),
    )


def right_padded(seqs):
    seqs = [torch.tensor(s) for s in seqs]
    return (
        pad(seqs, padding_value=PAD, padding_side="right"),
        pad([torch.ones_like(s) for s in seqs], padding_value=0, padding_side="right"),
    )


def test_prompt_groups_compare_real_tokens_only():
    # Rows 0, 1 and 3 hold the same prompt; row 2 differs; row 4 has a real token equal to the pad id, so it differs
    # from row 0 although its ids are the same.
    ids = torch.tensor([[0, 5, 6], [0, 5, 6], [7, 5, 6], [0, 5, 6], [0, 5, 6]])
    mask = torch.tensor([[0, 1, 1], [0, 1, 1], [1, 1, 1], [0, 1, 1], [1, 1, 1]])
    first, group = prompt_groups(ids, mask)
    assert group[0] == group[1] == group[3]
    assert len({int(group[0]), int(group[2]), int(group[4])}) == 3
    assert sorted(first.tolist()) == [0, 2, 4]
    assert all(int(first[group[r]]) <= r for r in range(5))  # the first row that holds each prompt


def test_length_chunks_keep_rows_of_one_prompt_together():
    # Prompts A (2 tokens), B (4), C (2, other tokens than A); rows interleaved.
    prompts = [[1, 2], [3, 4, 5, 6], [7, 8], [1, 2], [3, 4, 5, 6], [7, 8], [1, 2]]
    completions = [[9] * n for n in (3, 1, 2, 1, 5, 4, 2)]
    p_ids, p_mask = left_padded(prompts)
    c_ids, c_mask = right_padded(completions)
    chunks = length_chunks(torch.cat([p_ids, c_ids], 1), torch.cat([p_mask, c_mask], 1), c_ids.size(1), 3)
    order = torch.cat([rows for rows, _, _ in chunks]).tolist()
    # Short prompts first (A before C: distinct prompts are ordered by their tokens); the rows of a prompt together,
    # by completion length; the long prompt B last.
    assert order == [3, 6, 0] + [2, 5] + [1, 4]
    # first column after the shared padding (prompt width 4), and the chunk's longest completion
    assert [(start, keep) for _, start, keep in chunks] == [(2, 3), (0, 4), (0, 5)]


def rows_with_shared_prompts(generator):
    """Left-padded prompts (one of a single token) repeated over rows, right-padded completions, one inert row."""
    prompts = [torch.randint(3, 300, (n,), generator=generator).tolist() for n in (1, 5, 9, 3)]
    owners = [0, 0, 1, 1, 1, 2, 3, 3, 0]
    completions = [torch.randint(3, 300, (n,), generator=generator).tolist() for n in (4, 7, 1, 6, 6, 3, 2, 5, 4)]
    p_ids, p_mask = left_padded([prompts[o] for o in owners])
    c_ids, c_mask = right_padded(completions)
    c_mask[-1] = 0  # an inert row (zero completion mask), as `pad_rows` makes
    return p_ids, p_mask, c_ids, c_mask


def full_forward_logps(model, p_ids, p_mask, c_ids, c_mask):
    """GRPOTrainer's computation: one fused-head forward over prompt + completion."""
    ids, mask = torch.cat([p_ids, c_ids], 1), torch.cat([p_mask, c_mask], 1)
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, : p_ids.size(1)] = -100
    out = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
    return out.log_probs[:, -c_ids.size(1) :], out.entropy[:, -c_ids.size(1) :]


def logps_and_grads(model, compute, weights, c_mask):
    logps, entropy = compute()
    (logps * weights * c_mask).sum().backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return logps.detach() * c_mask, entropy.detach() * c_mask, grads


@needs_cache_api
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_shared_prompt_logps_and_gradients_equal_full_forward(tokenizer, arch, checkpointing):
    model = make_model(tokenizer, arch=arch, hidden=64)
    model.train()
    if checkpointing:
        model.gradient_checkpointing_enable({"use_reentrant": False})
    add_fused_lm_head(model, temperature=0.7, outputs=("log_probs", "entropy"))
    p_ids, p_mask, c_ids, c_mask = rows_with_shared_prompts(torch.Generator().manual_seed(0))
    weights = torch.randn(c_ids.shape, generator=torch.Generator().manual_seed(1))

    full = logps_and_grads(model, lambda: full_forward_logps(model, p_ids, p_mask, c_ids, c_mask), weights, c_mask)
    shared = logps_and_grads(model, lambda: shared_prompt_logps(model, p_ids, p_mask, c_ids, c_mask), weights, c_mask)

    torch.testing.assert_close(shared[0], full[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(shared[1], full[1], rtol=1e-5, atol=1e-5)
    assert full[0].abs().sum() > 0
    for name, grad in full[2].items():
        torch.testing.assert_close(shared[2][name], grad, rtol=1e-4, atol=1e-6, msg=name)
    assert sum(int(g.abs().sum() > 0) for g in full[2].values()) > 10


@needs_cache_api
def test_single_token_prompts(tokenizer):
    """Every prompt one token: the shared prefix is a masked padding column, and nothing changes."""
    model = make_model(tokenizer)
    add_fused_lm_head(model, outputs=("log_probs", "entropy"))
    p_ids, p_mask = left_padded([[5], [5], [9]])
    c_ids, c_mask = right_padded([[7, 8, 9], [10], [11, 12]])
    with torch.no_grad():
        shared = shared_prompt_logps(model, p_ids, p_mask, c_ids, c_mask)[0] * c_mask
        full = full_forward_logps(model, p_ids, p_mask, c_ids, c_mask)[0] * c_mask
    assert torch.isfinite(shared).all()
    torch.testing.assert_close(shared, full, rtol=1e-5, atol=1e-5)


@needs_cache_api
@pytest.mark.parametrize("max_new_tokens, capacity", [(6, 6), (6, 2)])  # capacity 2: the cache has to grow
def test_prefilled_cache_generates_like_a_full_prefill(tokenizer, max_new_tokens, capacity):
    model = make_model(tokenizer, hidden=64).eval()
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 300, (n,), generator=g).tolist() for n in (5, 9, 1)]  # one prompt of one token
    ids, mask = left_padded([p for p in prompts for _ in range(3)])
    greedy = dict(max_new_tokens=max_new_tokens, do_sample=False, output_scores=True, return_dict_in_generate=True,
                  pad_token_id=PAD)  # fmt: skip
    with torch.no_grad():
        plain = model.generate(input_ids=ids, attention_mask=mask, **greedy)
        cache = prefilled_cache(model, ids, mask, capacity)
        ours = model.generate(input_ids=ids, attention_mask=mask, cache=cache, **greedy)
    assert torch.equal(ours.sequences, plain.sequences)
    for step_ours, step_plain in zip(ours.scores, plain.scores, strict=True):
        torch.testing.assert_close(step_ours, step_plain, rtol=1e-5, atol=1e-5)


@needs_cache_api
def test_growing_cache_selects_and_repeats_rows(tokenizer):
    """The in-place cache keeps its rows right through `batch_select_indices` / `batch_repeat_interleave` and growth."""
    model = make_model(tokenizer).eval()
    ids, mask = left_padded([[5, 6, 7], [8, 9, 10]])
    with torch.no_grad():
        cache = prefilled_cache(model, ids, mask, 4)  # distinct prompts: rows 0 and 1, 2 prefilled positions
        keys = cache.layers[0].keys.clone()
        cache.batch_repeat_interleave(2)
        torch.testing.assert_close(cache.layers[0].keys, keys[[0, 0, 1, 1]])
        cache.batch_select_indices(torch.tensor([3, 0]))
        torch.testing.assert_close(cache.layers[0].keys, keys[[1, 0]])
        new = torch.randn(2, keys.size(1), 6, keys.size(-1))  # 2 + 6 positions: past the capacity of 3 + 4
        k, _ = cache.layers[0].update(new, new)
        torch.testing.assert_close(k, torch.cat([keys[[1, 0]], new], dim=-2))
        assert cache.get_seq_length() == 8
        cache.layers[0].crop(-3)  # what assisted decoding does: later updates write after the kept positions
        k, _ = cache.layers[0].update(new[:, :, :1], new[:, :, :1])
    torch.testing.assert_close(k, torch.cat([keys[[1, 0]], new[:, :, :3], new[:, :, :1]], dim=-2))


@needs_cache_api
def test_supports_prompt_sharing(tokenizer):
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    assert supports_prompt_sharing(make_model(tokenizer))
    assert supports_prompt_sharing(make_model(tokenizer, arch="qwen2"))
    assert supports_prompt_sharing(get_peft_model(make_model(tokenizer), LoraConfig(r=4, target_modules=["q_proj"])))
    from peft import PromptTuningConfig

    prompt_tuned = get_peft_model(
        make_model(tokenizer), PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=3)
    )
    assert not supports_prompt_sharing(prompt_tuned)  # virtual tokens in front of every forward
    from transformers import GPT2Config, GPT2LMHeadModel

    assert not supports_prompt_sharing(
        GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=1, n_head=2))
    )  # absolute positions
    sliding = make_model(tokenizer, arch="qwen2")
    sliding.config.layer_types = ["sliding_attention", "full_attention"]
    assert not supports_prompt_sharing(sliding)

    class NoCacheArgument(LlamaForCausalLM):  # a forward written for another transformers version
        def forward(self, input_ids=None, attention_mask=None, labels=None, **kwargs):
            return super().forward(input_ids=input_ids, attention_mask=attention_mask, labels=labels, **kwargs)

    assert not supports_prompt_sharing(NoCacheArgument(make_model(tokenizer).config))


def test_reentrant_checkpointing_is_detected(tokenizer):
    model = make_model(tokenizer)
    model.train()
    assert not uses_reentrant_checkpointing(model)
    model.gradient_checkpointing_enable({"use_reentrant": False})
    assert not uses_reentrant_checkpointing(model)
    model.gradient_checkpointing_enable({"use_reentrant": True})
    assert uses_reentrant_checkpointing(model)
    model.gradient_checkpointing_enable({"preserve_rng_state": True})  # torch then checkpoints reentrantly
    assert uses_reentrant_checkpointing(model)


def test_prefill_applies_only_to_plain_sampling(tokenizer):
    from transformers import GenerationConfig

    model = make_model(tokenizer)
    assert prefill_applies(GenerationConfig(do_sample=True, max_new_tokens=4), model)
    assert not prefill_applies(GenerationConfig(num_beams=2), model)  # generate would expand the rows, not the cache
    assert not prefill_applies(GenerationConfig(num_return_sequences=2, do_sample=True), model)
    assert not prefill_applies(GenerationConfig(cache_implementation="static"), model)
    assert not prefill_applies(GenerationConfig(use_cache=False), model)
    model.generation_config.cache_implementation = "static"  # unset in the config: the model's value applies
    assert not prefill_applies(GenerationConfig(do_sample=True), model)


def train_one_step(tmp_path, tokenizer, share_prompts, checkpointing=None):
    agents = [make_model(tokenizer, seed=s) for s in (1, 2)]
    args = MAGRPOConfig(
        output_dir=str(tmp_path / f"share_{share_prompts}"), num_generations=4, per_device_train_batch_size=8,
        max_new_tokens=8, max_steps=1, num_turns=2, early_termination_threshold=None, report_to="none", seed=0,
        learning_rate=0.5, optim="sgd", lr_scheduler_type="constant", max_grad_norm=0.0, logging_steps=1,
        share_prompts=share_prompts, gradient_checkpointing=checkpointing is not None,
        gradient_checkpointing_kwargs=checkpointing,
    )  # fmt: skip
    trainer = MAGRPOTrainer(
        model=agents, processing_class=tokenizer, reward_funcs=length_ratio_reward, external_transition=length_feedback,
        train_dataset=Dataset.from_dict({"prompt": SEED_PROMPTS[:2]}), args=args,
    )  # fmt: skip
    assert trainer.share_prompts is share_prompts
    before = [{k: v.clone() for k, v in a.state_dict().items()} for a in agents]
    trainer.train()
    steps = [{k: a.state_dict()[k] - v for k, v in b.items()} for a, b in zip(agents, before, strict=True)]
    return trainer.state.log_history[0], steps


@needs_cache_api
@pytest.mark.parametrize("checkpointing", [None, {"use_reentrant": False}, {"use_reentrant": True}])
def test_training_step_with_shared_prompts_equals_plain_step(tmp_path, tokenizer, checkpointing):
    """Two agents, two turns, full tree: same rewards, loss and SGD weight updates with and without sharing (under
    reentrant checkpointing, which would drop the shared keys' gradient, the trainer computes plainly)."""
    plain_log, plain_steps = train_one_step(tmp_path, tokenizer, False, checkpointing)
    shared_log, shared_steps = train_one_step(tmp_path, tokenizer, True, checkpointing)
    for key in ("turn_1/reward_mean", "turn_2/reward_mean", "completions/mean_length"):
        assert shared_log[key] == pytest.approx(plain_log[key], abs=1e-6), key  # the same rollout
    assert shared_log["loss"] == pytest.approx(plain_log["loss"], rel=1e-4, abs=1e-6)
    moved = 0
    for plain, shared in zip(plain_steps, shared_steps, strict=True):
        for name, step in plain.items():
            torch.testing.assert_close(shared[name], step, rtol=1e-3, atol=1e-6, msg=name)
            moved += int(step.abs().sum() > 0)
    assert moved > 20


def test_generation_turns_checkpointing_back_on_with_the_configs_kwargs(tmp_path, tokenizer):
    """Generation runs with activation checkpointing off, then turns it back on with `gradient_checkpointing_kwargs`,
    here reentrant (transformers' default is not): TRL 1.15's unwrap helper would turn it back on without them."""
    checkpointing = {"use_reentrant": True}
    args = MAGRPOConfig(
        output_dir=str(tmp_path), num_generations=2, per_device_train_batch_size=2, max_new_tokens=4,
        report_to="none", gradient_checkpointing=True, gradient_checkpointing_kwargs=checkpointing,
    )  # fmt: skip
    trainer = MAGRPOTrainer(
        model=[make_model(tokenizer, seed=s) for s in (1, 2)], processing_class=tokenizer, reward_funcs=length_ratio_reward,
        train_dataset=Dataset.from_dict({"prompt": SEED_PROMPTS[:2]}), args=args,
    )  # fmt: skip
    trainer.team.gradient_checkpointing_enable(checkpointing)  # as `Trainer.train` does, with the config's kwargs
    tree = trainer.rollout([{"prompt": SEED_PROMPTS[0]}], 2)
    assert [len(completions) for completions in tree.nodes[0].completions] == [2, 2]  # both agents generated
    assert trainer.team.is_gradient_checkpointing and uses_reentrant_checkpointing(trainer.team)
