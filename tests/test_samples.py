"""`SampleAnswers`: the joint answers it shows are the ones scored, with their own rewards, at the first and last step."""

import pytest
from conftest import SEED_PROMPTS, length_feedback, length_ratio_reward
from datasets import Dataset

from trl_multiagent import MAGRPOConfig, MAGRPOTrainer
from trl_multiagent.demo.samples import SampleAnswers, format_samples
from trl_multiagent.demo.testing import make_model


def test_samples_are_the_scored_joint_answers_of_the_first_and_last_step(tmp_path, tokenizer):
    args = MAGRPOConfig(
        output_dir=str(tmp_path), num_turns=2, num_generations=2, per_device_train_batch_size=4, max_new_tokens=8,
        max_steps=3, early_termination_threshold=None, report_to="none", logging_steps=1, seed=0,
    )  # fmt: skip
    trainer = MAGRPOTrainer(
        model=[make_model(tokenizer, seed=i) for i in range(2)], processing_class=tokenizer, reward_funcs=length_ratio_reward,
        external_transition=length_feedback, train_dataset=Dataset.from_dict({"prompt": SEED_PROMPTS}), args=args,
    )  # fmt: skip
    printed = []
    samples = SampleAnswers(trainer, per_turn=2, printer=printed.append)
    trainer.add_callback(samples)
    trainer.train()

    assert sorted(samples.steps) == [1, 3]
    for turns in samples.steps.values():
        # 2 prompts: turn 1 scores 2 x K=2 joint answers; every branch goes on, with K=2 joint answers each
        assert [len(turns[1]), len(turns[2])] == [4, 8]
        for scored in turns.values():
            for answers, reward in scored:
                assert reward == pytest.approx(length_ratio_reward([answers[0]], [answers[1]])[0])
    assert printed == ["\n".join(format_samples(step, samples.steps[step], 2)) for step in (1, 3)]
    assert samples.lines() == printed[0].splitlines() + printed[1].splitlines()
    assert printed[0].count("  turn 1, reward ") == 2 and printed[0].count("  turn 2, reward ") == 2
