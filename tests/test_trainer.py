"""MAGRPOTrainer on tiny random models: tree sizes, metrics, saving and resuming."""

import glob
import os
from collections import defaultdict

import pytest
import torch
from conftest import SEED_PROMPTS, length_feedback, length_ratio_reward
from datasets import Dataset
from tiny import make_model
from transformers import AutoModelForCausalLM, TrainerCallback

from trl_multiagent import MAGRPOConfig, MAGRPOTrainer


def config(tmp_path, **overrides):
    values = dict(
        output_dir=str(tmp_path / "run"),
        num_generations=4,
        per_device_train_batch_size=8,
        max_new_tokens=8,
        num_train_epochs=1,
        logging_steps=1,
        report_to="none",
        seed=0,
    )
    values.update(overrides)
    return MAGRPOConfig(**values)


def team(tokenizer, n=2, seed=0):
    return [make_model(tokenizer, seed=seed + i) for i in range(n)]


def dataset(n=4):
    return Dataset.from_dict({"prompt": SEED_PROMPTS[:n]})


class CountingReward:
    """Records, per turn, how many joint answers each reward call scored."""

    __name__ = "counting_reward"

    def __init__(self):
        self.sizes = defaultdict(list)

    def __call__(self, completions1, completions2, turn, **kwargs):
        self.sizes[turn].append(len(completions1))
        return length_ratio_reward(completions1, completions2)


@pytest.mark.parametrize(
    "threshold, mode, k, expected",
    [(None, "aligned", 4, {1: 4, 2: 16}), (-0.2, "aligned", 4, {1: 4}), (None, "cross", 2, {1: 4, 2: 16})],
)
def test_joint_answers_per_prompt(tmp_path, tokenizer, threshold, mode, k, expected):
    reward = CountingReward()
    args = config(
        tmp_path, num_turns=2, early_termination_threshold=threshold, joint_mode=mode, num_generations=k,
        per_device_train_batch_size=2 * k, max_steps=1, check_functions_before_training=False,
    )  # fmt: skip
    trainer = MAGRPOTrainer(
        agents=team(tokenizer), tokenizer=tokenizer, reward_func=reward, external_transition=length_feedback,
        train_dataset=dataset(), args=args,
    )  # fmt: skip
    trainer.train()
    prompts_per_step = 2
    assert {t: sizes[0] // prompts_per_step for t, sizes in reward.sizes.items()} == expected
    assert all(len(sizes) == 1 for sizes in reward.sizes.values())  # one reward call per turn


def test_metrics_reach_tensorboard(tmp_path, tokenizer):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    args = config(
        tmp_path, num_turns=2, early_termination_threshold=None, report_to="tensorboard", max_steps=2,
    )  # fmt: skip
    trainer = MAGRPOTrainer(
        agents=team(tokenizer), tokenizer=tokenizer, reward_func=length_ratio_reward,
        external_transition=length_feedback, train_dataset=dataset(), args=args,
    )  # fmt: skip
    trainer.train()
    events = glob.glob(str(tmp_path / "**" / "events.out.tfevents*"), recursive=True)
    assert events
    acc = EventAccumulator(os.path.dirname(events[0]))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    for key in [
        "turn_1/reward_mean", "turn_2/reward_mean", "turn_1/reward_std", "turn_1/expected_return",
        "turn_1/terminated_frac", "agent_0/completions/mean_length", "agent_1/completions/mean_length",
        "reward", "reward_std", "entropy", "clip_ratio/region_mean", "completions/mean_length",
        "throughput/generate_tokens_per_s",
    ]:  # fmt: skip
        assert f"train/{key}" in tags, key
    # turn-1 expected return = turn-1 reward + mean turn-2 return (discount 1, every branch expanded)
    last = trainer.state.log_history[-2]
    assert last["turn_1/expected_return"] == pytest.approx(last["turn_1/reward_mean"] + last["turn_2/reward_mean"])
    assert last["turn_2/terminated_frac"] <= 1.0 and last["turn_1/terminated_frac"] == 0.0


def test_save_model_writes_loadable_agents(tmp_path, tokenizer):
    args = config(tmp_path, max_steps=1, learning_rate=1e-2)
    agents = team(tokenizer)
    trainer = MAGRPOTrainer(agents=agents, tokenizer=tokenizer, reward_func=length_ratio_reward,
                            train_dataset=dataset(), args=args)  # fmt: skip
    trainer.train()
    out = tmp_path / "saved"
    trainer.save_model(str(out))
    for i, agent in enumerate(agents):
        loaded = AutoModelForCausalLM.from_pretrained(out / f"agent_{i}")
        for (name, p), q in zip(agent.state_dict().items(), loaded.state_dict().values()):
            assert torch.equal(p, q), name
    # the agents did train, and differently from each other
    fresh = make_model(tokenizer, seed=0)
    assert not torch.equal(fresh.model.layers[0].mlp.up_proj.weight, agents[0].model.layers[0].mlp.up_proj.weight)


def _final_weights(trainer):
    return [{k: v.clone() for k, v in a.state_dict().items()} for a in trainer.team.agents]


def test_resume_matches_uninterrupted_run(tmp_path, tokenizer):
    class StopAt(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            control.should_training_stop = state.global_step == 2

    def run(output, resume=None, interrupt=False):
        args = config(
            tmp_path, output_dir=str(output), num_turns=2, early_termination_threshold=0.9, max_steps=4,
            save_steps=2, learning_rate=1e-2, per_device_train_batch_size=4,
        )  # fmt: skip
        trainer = MAGRPOTrainer(
            agents=team(tokenizer), tokenizer=tokenizer, reward_func=length_ratio_reward,
            external_transition=length_feedback, train_dataset=dataset(), args=args,
            callbacks=[StopAt()] if interrupt else None,
        )  # fmt: skip
        trainer.train(resume_from_checkpoint=resume)
        return trainer

    full = _final_weights(run(tmp_path / "full"))
    assert run(tmp_path / "part", interrupt=True).state.global_step == 2  # interrupted after saving checkpoint-2
    resumed = run(tmp_path / "resumed", resume=str(tmp_path / "part" / "checkpoint-2"))
    assert resumed.state.global_step == 4
    for a, b in zip(full, _final_weights(resumed)):
        for name in a:
            torch.testing.assert_close(a[name], b[name], msg=name)


def test_evaluation_rollouts(tmp_path, tokenizer):
    args = config(
        tmp_path, num_turns=2, early_termination_threshold=None, max_steps=2, eval_strategy="steps", eval_steps=1,
        eval_on_start=True, per_device_eval_batch_size=2, num_generations_eval=1, eval_do_sample=False,
    )  # fmt: skip
    trainer = MAGRPOTrainer(
        agents=team(tokenizer), tokenizer=tokenizer, reward_func=length_ratio_reward,
        external_transition=length_feedback, train_dataset=dataset(), eval_dataset=dataset(2), args=args,
    )  # fmt: skip
    trainer.train()
    evals = [h for h in trainer.state.log_history if "eval_loss" in h]
    assert [h["step"] for h in evals] == [0, 1, 2]  # a baseline before training, then after each step
    for h in evals:
        for t in (1, 2):
            assert f"eval_turn_{t}/reward_mean" in h and f"eval_turn_{t}/expected_return" in h
        # greedy, one completion per agent: 2 prompts x 1 joint answer, each expanded once
        assert h["eval_turn_1/expected_return"] == pytest.approx(
            h["eval_turn_1/reward_mean"] + h["eval_turn_2/reward_mean"]
        )
    # greedy evaluation is deterministic: evaluating twice gives the same rewards
    first, second = trainer.evaluate(), trainer.evaluate()
    assert first["eval_turn_1/reward_mean"] == second["eval_turn_1/reward_mean"]
    assert first["eval_turn_2/reward_mean"] == second["eval_turn_2/reward_mean"]
    assert first["eval_turn_1/reward_mean"] == evals[-1]["eval_turn_1/reward_mean"]


def test_length_chunked_logps_equal_padded_logps(tmp_path, tokenizer):
    """Sorting rows by length and trimming shared padding changes no log-prob or entropy (beyond float rounding)."""
    from trl import GRPOTrainer

    from trl_multiagent.batching import agent_rows, length_chunks

    trainer = MAGRPOTrainer(agents=team(tokenizer, n=1), tokenizer=tokenizer, reward_func=lambda c: [0.0] * len(c),
                            train_dataset=dataset(), args=config(tmp_path))  # fmt: skip
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 300, (n,), generator=g).tolist() for n in (3, 30, 5, 28, 12, 2)]
    completions = [torch.randint(3, 300, (n,), generator=g).tolist() for n in (8, 1, 4, 8, 2, 6)]
    rows = agent_rows(prompts, completions, torch.zeros(6), tokenizer.pad_token_id)
    ids = torch.cat([rows["prompt_ids"], rows["completion_ids"]], 1)
    mask = torch.cat([rows["prompt_mask"], rows["completion_mask"]], 1)
    chunks = length_chunks(ids, mask, 8, chunk_rows=2)
    # prompt lengths 3, 30, 5, 28, 12, 2: sorted, in pairs
    assert [c[0].tolist() for c in chunks] == [[5, 0], [2, 4], [3, 1]]
    # first column after the padding the pair shares (prompt width 30), and the pair's longest completion
    assert [(c[1], c[2]) for c in chunks] == [(27, 8), (18, 4), (0, 8)]
    model = trainer.team.agent(0)
    with torch.no_grad(), trainer.team.acting(0):
        ours = trainer._get_per_token_logps_and_entropies(
            trainer.team, ids, mask, 8, batch_size=2, compute_entropy=True
        )
        padded = GRPOTrainer._get_per_token_logps_and_entropies(trainer, model, ids, mask, 8, compute_entropy=True)
    completion_mask = rows["completion_mask"].bool()
    torch.testing.assert_close(ours[0][completion_mask], padded[0][completion_mask], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours[1][completion_mask], padded[1][completion_mask], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("baseline, scale", [("rloo", 4 / 3), ("none", None), ("max", None)])
def test_advantage_baseline_reaches_the_update(tmp_path, tokenizer, baseline, scale):
    """One on-policy SGD step moves the weights linearly in the advantages: RLOO's step is K/(K-1) times GRPO's mean
    baseline's; the raw and max baselines move them differently."""
    steps = {}
    for name in ("mean", baseline):
        agents = team(tokenizer, n=1, seed=3)
        before = {k: v.clone() for k, v in agents[0].state_dict().items()}
        args = config(
            tmp_path / name, max_steps=1, scale_rewards="none", advantage_baseline=name, learning_rate=0.5,
            optim="sgd", lr_scheduler_type="constant", max_grad_norm=0.0,
        )  # fmt: skip
        trainer = MAGRPOTrainer(
            agents=agents, tokenizer=tokenizer, reward_func=lambda completions: [len(c) / 10 for c in completions],
            train_dataset=dataset(), args=args,
        )  # fmt: skip
        trainer.train()
        steps[name] = torch.cat([(agents[0].state_dict()[k] - v).flatten() for k, v in before.items()])
    assert steps["mean"].abs().max() > 1e-4
    if scale is not None:
        torch.testing.assert_close(steps[baseline], scale * steps["mean"], rtol=1e-3, atol=1e-6)
    else:
        assert (steps[baseline] - steps["mean"]).abs().max() > 1e-4
