"""Runs that cannot learn say so (`diagnostics`): real tiny-model runs, the WARNINGs read from the log."""

from conftest import SEED_PROMPTS, length_feedback, length_ratio_reward
from datasets import Dataset

import trl_multiagent.diagnostics as diagnostics
from trl_multiagent import MAGRPOConfig, MAGRPOTrainer
from trl_multiagent.demo.testing import make_model


CANNOT_LEARN = "cannot learn"
AFTER_STEP_LINE = "but turn 2 never ran in step 1"


def build(tmp_path, tokenizer, reward, steps=3, **overrides):
    values = dict(
        output_dir=str(tmp_path / "run"), num_generations=2, per_device_train_batch_size=4, max_new_tokens=4,
        max_steps=steps, logging_steps=1, report_to="none", seed=0, num_turns=1, save_strategy="no",
        learning_rate=1e-2, check_functions_before_training=False,
    )  # fmt: skip
    values.update(overrides)
    trainer = MAGRPOTrainer(
        model=[make_model(tokenizer, seed=i) for i in range(2)], processing_class=tokenizer, reward_funcs=reward,
        external_transition=length_feedback, train_dataset=Dataset.from_dict({"prompt": SEED_PROMPTS}),
        args=MAGRPOConfig(**values),
    )  # fmt: skip
    return trainer


def train(tmp_path, tokenizer, reward, steps=3, **overrides):
    trainer = build(tmp_path, tokenizer, reward, steps, **overrides)
    trainer.train()
    return trainer


def constant_reward(completions1, completions2):
    return [0.5] * len(completions1)


def test_a_constant_reward_is_said_once_with_its_cause(tmp_path, tokenizer, caplog):
    with caplog.at_level("WARNING", logger="trl_multiagent.diagnostics"):
        trainer = train(tmp_path, tokenizer, constant_reward, steps=3)
    steps = [e for e in trainer.state.log_history if "reward" in e]
    assert [e["frac_reward_zero_std"] for e in steps] == [1.0, 1.0, 1.0]  # the metric itself is unchanged
    warnings = [r.getMessage() for r in caplog.records if CANNOT_LEARN in r.getMessage()]
    assert len(warnings) == 1, warnings  # three steps, the same blockers: said once
    assert warnings[0].startswith("MAGRPOTrainer: step 1 cannot learn: every group of K answers scored the same")
    assert "the loss and the gradient norm are 0" in warnings[0]
    assert "a constant reward: every joint answer of the step scored 0.5" in warnings[0]


def test_the_warning_comes_again_when_what_blocks_changes():
    callback = diagnostics.LearningSignalCallback(1, [0, 1], -0.2, False)
    state = type("State", (), {"is_world_process_zero": True, "global_step": 1})()
    said = []
    diagnostics.logger.warning = said.append  # instance attribute: this logger only, for this test
    try:
        constant = {"reward": 0.5, "reward_std": 0.0, "frac_reward_zero_std": 1.0, "loss": 0.0, "grad_norm": 0.0}
        saturated = {**constant, "reward_std": 0.3}  # same blockers, another cause: not said again
        empty = {**constant, "agent_0/completions/mean_length": 0.0, "agent_1/completions/mean_length": 0.0}
        learning = {"reward": 0.5, "reward_std": 0.3, "frac_reward_zero_std": 0.5, "loss": 0.2, "grad_norm": 1.0}
        for logs in (constant, constant, saturated, empty, empty, learning, constant):
            callback.on_log(None, state, None, logs=logs)
    finally:
        del diagnostics.logger.warning
    assert len(said) == 3, said  # constant; empty (a new blocker); constant again after a step that learned
    assert "no completion of a trainable agent had a token in the loss" in said[1]


def test_a_negative_threshold_two_turn_run_says_turn_2_never_ran(tmp_path, tokenizer, caplog):
    diagnostics.logger.warning_once.cache_clear()
    with caplog.at_level("WARNING", logger="trl_multiagent.diagnostics"):  # the reward is never negative
        trainer = train(
            tmp_path, tokenizer, length_ratio_reward, steps=2, num_turns=2, early_termination_threshold=-0.2
        )
    assert trainer.state.log_history[0]["turn_1/terminated_frac"] == 1.0
    assert "turn_2/reward_mean" not in trainer.state.log_history[0]
    messages = [r.getMessage() for r in caplog.records]
    assert sum(AFTER_STEP_LINE in m for m in messages) == 1, messages
    assert "early_termination_threshold=None" in next(m for m in messages if AFTER_STEP_LINE in m)


def test_a_learning_run_says_neither(tmp_path, tokenizer, caplog):
    diagnostics.logger.warning_once.cache_clear()
    with caplog.at_level("WARNING", logger="trl_multiagent.diagnostics"):
        trainer = train(
            tmp_path, tokenizer, length_ratio_reward, steps=2, num_turns=2, early_termination_threshold=None
        )
    assert "turn_2/reward_mean" in trainer.state.log_history[0]  # both turns ran
    assert all(e["grad_norm"] > 0 for e in trainer.state.log_history if "grad_norm" in e)
    assert [r.getMessage() for r in caplog.records] == []
