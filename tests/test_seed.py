"""The user's seed example (shared/seeds), run with only the import and the model source changed."""

import math

import pytest


@pytest.fixture
def model_name(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the seed's config writes to the default output_dir
    return tiny_model_dir


def test_seed_example_runs_unchanged(model_name):
    # ---- seed code, verbatim except the import line and `model_name` ----
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_multiagent.comlrl import MAGRPOConfig, MAGRPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(model_name)
    train_dataset = Dataset.from_dict(
        {
            "prompt": [
                "Describe a city in the clouds:",
                "Invent a new holiday and explain it:",
                "Write a bedtime story for a dragon:",
                "Design a playground on Mars:",
            ]
        }
    )

    def length_ratio_reward(completions1, completions2):
        rewards = []
        for first, second in zip(completions1, completions2, strict=True):
            ratio = len(second) / max(len(first), 1)
            distance = 0.0 if 2 <= ratio <= 3 else min(abs(ratio - 2), abs(ratio - 3))
            rewards.append(math.exp(-distance))
        return rewards

    def length_feedback(prompt, agent_completions, num_agents, **history):
        lengths = [len(text) for text in agent_completions]
        ratio = lengths[1] / max(lengths[0], 1)
        return [
            f"{prompt}\n\nYour last answer had {lengths[i]} characters. "
            f"The second answer was {ratio:.1f} times as long as the first; "
            "the goal is 2 to 3 times. Please write an improved answer."
            for i in range(num_agents)
        ]

    config = MAGRPOConfig(
        num_turns=2,
        num_train_epochs=2,
        num_generations=4,
        max_new_tokens=64,
        logging_steps=1,
        early_termination_threshold=0.9,
    )
    trainer = MAGRPOTrainer(
        agents=[AutoModelForCausalLM.from_pretrained(model_name) for _ in range(2)],
        tokenizer=tokenizer,
        reward_func=length_ratio_reward,
        external_transition=length_feedback,
        train_dataset=train_dataset,
        args=config,
    )
    trainer.train()
    # ---- end of seed code ----

    logs = [h for h in trainer.state.log_history if "turn_1/reward_mean" in h]
    assert trainer.state.epoch == pytest.approx(2.0)
    # CoMLRL's step: one prompt (rollout_buffer_size=2 tree nodes of an agent hold one prompt's 5-node tree), so
    # 4 prompts x 2 epochs
    assert len(logs) == trainer.state.global_step == 8
    assert (config.per_device_train_batch_size, config.learning_rate, config.temperature) == (4, 5e-6, 0.6)
    assert all("turn_2/reward_mean" in h for h in logs)
    for h in logs:
        assert 0.0 < h["turn_1/reward_mean"] <= 1.0 and 0.0 < h["turn_2/reward_mean"] <= 1.0
        # early termination at 0.9: the turn-1 return adds the mean turn-2 return of expanded branches
        assert h["turn_1/expected_return"] >= h["turn_1/reward_mean"]
