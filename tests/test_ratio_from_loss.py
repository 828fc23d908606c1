"""vLLM's importance-sampling correction without the old-policy pass (`importance.RatioFromLoss`).

When a generation's rows serve one optimizer step, the ratio comes from the loss's own log-probs: the loss, its
gradients and the `sampling/*` statistics must equal TRL's two-pass computation (an old-policy forward, then
`_compute_loss` with `old_per_token_logps` and `importance_sampling_ratio` in its inputs) for every loss type and
mode; the pass is skipped on-policy and kept off-policy and in evaluation.

The transformers backend stands in for vLLM's sampler here (vLLM has its own environment, `tests/test_vllm.py`): its
completions get "sampler" log-probs made of the policy's own plus seeded noise, so that the clip bounds bite.
"""

import copy

import pytest
import torch
from conftest import SEED_PROMPTS, length_feedback, length_ratio_reward
from datasets import Dataset

from trl_multiagent import MAGRPOConfig, MAGRPOTrainer
from trl_multiagent.demo.testing import make_model
from trl_multiagent.update.chunking import LOSS_TYPES
from trl_multiagent.update.importance import MODES, add_importance_sampling_ratio, sampling_stats


K, PROMPTS_PER_STEP = 2, 2
CLIPS = {"token": (0.97, 1.03), "sequence": (0.9, 1.1)}  # noise of 0.05 per token puts many rows outside


def build(tmp_path, tokenizer, loss_type="grpo", mode="token_truncate", **overrides):
    extra = {"importance_sampling_level": "sequence"} if loss_type == "luspo" else {}
    low, high = CLIPS[mode.split("_")[0]]
    values = dict(
        output_dir=str(tmp_path), num_generations=K, per_device_train_batch_size=K * PROMPTS_PER_STEP, num_turns=2,
        max_new_tokens=6, early_termination_threshold=None, loss_type=loss_type, report_to="none", max_steps=2,
        logging_steps=1, save_strategy="no", seed=0, disable_tqdm=True, check_functions_before_training=False,
        vllm_importance_sampling_mode=mode, vllm_importance_sampling_clip_min=low,
        vllm_importance_sampling_clip_max=high, **extra,
    )  # fmt: skip
    values.update(overrides)
    trainer = MAGRPOTrainer(
        model=[make_model(tokenizer, seed=s) for s in (1, 2)], processing_class=tokenizer, reward_funcs=length_ratio_reward,
        external_transition=length_feedback, train_dataset=Dataset.from_dict({"prompt": SEED_PROMPTS}),
        args=MAGRPOConfig(**values),
    )  # fmt: skip
    sample_like_vllm(trainer)
    return trainer


def sample_like_vllm(trainer):
    """Turn the correction on, with the transformers sampler reporting per-token log-probs as vLLM's does: the
    policy's own (temperature 1), plus noise."""
    trainer.use_vllm = trainer.vllm_importance_sampling_correction = True
    sample, noise = trainer.generator._sample, torch.Generator().manual_seed(0)

    def sample_with_logps(agent, prompt_ids, num_generations, greedy):
        completions, _ = sample(agent, prompt_ids, num_generations, greedy)
        logps = []
        with torch.no_grad(), trainer.team.acting(agent):
            model = trainer.team.agent(agent)
            for prompt, completion in zip(
                [p for p in prompt_ids for _ in range(num_generations)], completions, strict=True
            ):
                ids = torch.tensor([list(prompt) + list(completion)])
                logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1]
                own = logits.log_softmax(-1).gather(-1, ids[0, len(prompt) :, None])[:, 0]
                logps.append((own + 0.05 * torch.randn(own.shape, generator=noise)).tolist())
        return completions, logps

    trainer.generator._sample = sample_with_logps


def rollout(trainer):
    rows = [{"prompt": p} for p in SEED_PROMPTS[:PROMPTS_PER_STEP] for _ in range(K)]
    trainer.model.train()
    return trainer._generate_and_score_completions(rows)["agents"]


def two_pass(trainer, batches):
    """TRL's computation: an old-policy forward over each agent's rows (as GRPOTrainer's, in the trainer's chunks),
    the ratio from it, then the loss with both in its inputs; with the statistics of those rows."""
    batches, stats = copy.deepcopy(batches), {}
    for agent, batch in enumerate(batches):
        ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
        mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
        with torch.no_grad(), trainer.team.acting(agent):
            old = trainer._get_per_token_logps_and_entropies(
                trainer.model, ids, mask, batch["completion_ids"].size(1), trainer.update_chunk_size
            )[0]
        batch["old_per_token_logps"] = old
        stats[agent] = sampling_stats(*add_importance_sampling_ratio(batch, old, trainer.args))
    return batches, stats


def loss_and_gradients(trainer, batches):
    trainer.model.zero_grad()
    loss = trainer.compute_loss(trainer.model, batches)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in trainer.model.parameters() if p.grad is not None]


CASES = [(loss, mode) for loss in LOSS_TYPES for mode in MODES if loss != "vespo" or mode.startswith("token")]


@pytest.mark.parametrize("loss_type, mode", CASES)
def test_ratio_from_the_loss_equals_two_passes(tmp_path, tokenizer, loss_type, mode):
    trainer = build(tmp_path, tokenizer, loss_type, mode, beta=0.04, update_chunk_size=3)
    trainer.current_gradient_accumulation_steps = 1
    batches = rollout(trainer)
    assert all("old_per_token_logps" not in b and "importance_sampling_ratio" not in b for b in batches)

    reference, reference_stats = two_pass(trainer, batches)
    expected_loss, expected_grads = loss_and_gradients(trainer, reference)
    loss, grads = loss_and_gradients(trainer, batches)
    stats = trainer._ratio_from_loss.flush()

    assert torch.equal(loss, expected_loss), (loss, expected_loss)
    assert len(grads) == len(expected_grads) > 0
    for grad, expected in zip(grads, expected_grads, strict=True):
        assert torch.equal(grad, expected)
    assert stats.keys() == reference_stats.keys() == {0, 1}
    for agent, expected in reference_stats.items():  # means over the same values, summed in another order
        assert stats[agent] == {key: pytest.approx(value, rel=1e-6) for key, value in expected.items()}
    ratios = torch.cat([r["importance_sampling_ratio"].flatten() for r in reference])
    low, high = CLIPS[mode.split("_")[0]]
    assert (ratios == (0.0 if mode.endswith("mask") else low)).any() or (ratios == high).any()  # bounds bit
    assert ((ratios > low) & (ratios < high)).any()  # and not every row


class LogpsCalls:
    """Counts the trainer's log-prob forwards outside the loss (with gradients off)."""

    def __init__(self, trainer):
        self.count, compute = 0, trainer._get_per_token_logps_and_entropies

        def counted(*args, **kwargs):
            self.count += not torch.is_grad_enabled()
            return compute(*args, **kwargs)

        trainer._get_per_token_logps_and_entropies = counted


def test_on_policy_training_skips_the_old_policy_pass_and_logs_the_statistics(tmp_path, tokenizer):
    trainer = build(tmp_path, tokenizer)
    calls = LogpsCalls(trainer)
    trainer.train()
    assert calls.count == 0
    steps = [e for e in trainer.state.log_history if "sampling/importance_sampling_ratio/min" in e]
    assert len(steps) == 2
    for entry in steps:
        for key in ("sampling/sampling_logp_difference/mean", "agent_0/sampling/importance_sampling_ratio/max"):
            assert entry[key] == entry[key], key  # present, not NaN
        assert 0.0 < entry["sampling/sampling_logp_difference/mean"] < 0.1  # |noise| of sd 0.05


@pytest.mark.parametrize(
    "overrides", [{"num_iterations": 2}, {"steps_per_generation": 2}], ids=["num_iterations", "steps_per_generation"]
)
def test_off_policy_training_keeps_the_pass(tmp_path, tokenizer, overrides):
    trainer = build(tmp_path, tokenizer, max_steps=1, **overrides)
    calls = LogpsCalls(trainer)
    trainer.train()
    assert calls.count == 2  # one generation, one pass per agent
    assert [e for e in trainer.state.log_history if "sampling/importance_sampling_ratio/min" in e]


def test_evaluation_keeps_the_pass(tmp_path, tokenizer):
    trainer = build(tmp_path, tokenizer)
    calls = LogpsCalls(trainer)
    trainer.model.eval()
    rows = [{"prompt": p} for p in SEED_PROMPTS[:PROMPTS_PER_STEP] for _ in range(K)]
    batches = trainer._generate_and_score_completions(rows)["agents"]
    assert calls.count == 2
    assert all("importance_sampling_ratio" in b for b in batches)
